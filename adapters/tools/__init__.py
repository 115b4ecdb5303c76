"""Tool adapters: Python tool modules loaded from ``TURNLOG_TOOLS_DIR``."""

from adapters.tools.loader import LoadError, MethodTool, ModuleTools, load_tools_dir, merge_tools

__all__ = ["LoadError", "MethodTool", "ModuleTools", "load_tools_dir", "merge_tools"]

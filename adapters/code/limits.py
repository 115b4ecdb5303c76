"""What one code run may use: shared by both executors (the Jupyter one applies
the wall clock, the output caps and the file caps; the kernel's own process
limits are the Jupyter server's business)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from adapters.config import Settings


@dataclass(frozen=True)
class CodeLimits:
    wall_seconds: float = 30.0  # stays below TURNLOG_TOOL_TIMEOUT, which cuts the whole call
    cpu_seconds: int = 20
    memory_mb: int = 512  # address space (RLIMIT_AS) of each process
    file_size_mb: int = 16  # any one file (RLIMIT_FSIZE)
    disk_mb: int = 64  # the sandbox's private /tmp, working directory included (a tmpfs)
    max_processes: int = 32  # processes and threads (RLIMIT_NPROC)
    max_open_files: int = 256
    output_bytes: int = 32_768  # stdout and stderr each, and the result's repr
    max_files: int = 10
    files_bytes: int = 4 * 1024 * 1024  # files returned, in total (before base64)

    @classmethod
    def from_settings(cls, settings: Settings) -> CodeLimits:
        return cls(
            wall_seconds=settings.code_timeout,
            cpu_seconds=settings.code_cpu_seconds,
            memory_mb=settings.code_memory_mb,
            file_size_mb=settings.code_file_size_mb,
            disk_mb=settings.code_disk_mb,
            max_processes=settings.code_max_processes,
            output_bytes=settings.code_output_bytes,
            max_files=settings.code_max_files,
            files_bytes=settings.code_files_bytes,
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def cut_note(cut: int) -> str:
    """The line that ends a stream cut at the output limit."""
    return f"\n[… {cut:,} more bytes of output not shown]"


def stopped_note(reason: str) -> str:
    return f"[stopped: {reason}]"

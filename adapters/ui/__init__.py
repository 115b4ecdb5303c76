"""The inspector's static page (served by adapters.http.ui_routes)."""

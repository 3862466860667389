"""The documentation site: Sphinx with MyST Markdown and the PyData theme, as Jupyter projects
build theirs. ``make docs`` builds it into docs/_build/html with warnings as errors."""

from __future__ import annotations

from importlib.metadata import version as _installed

project = "jupyter-portable"
author = "the jupyter-portable developers"
release = version = _installed("jupyter-portable")
copyright = "2026, the jupyter-portable developers"

extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "README.md"]
# headings get anchors, so pages link to each other's sections ([x](page.md#a-heading))
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]

html_theme = "pydata_sphinx_theme"
html_title = "jupyter-portable"
html_static_path: list[str] = []
templates_path = ["_templates"]
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "header_links_before_dropdown": 6,
    "secondary_sidebar_items": ["page-toc"],
    "footer_start": ["copyright"],
    "footer_end": [],
}
# every page, the index too, lists the whole site (docs/_templates/sidebar-nav-all.html): with the
# theme's own sidebar-nav-bs the sidebar was empty, every page being top-level
html_sidebars: dict[str, list[str]] = {"**": ["sidebar-nav-all"]}

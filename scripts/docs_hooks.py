"""MkDocs hooks of the documentation site (mkdocs.yml: ``hooks``).

Tables that the code owns are generated when the site is built, never copied by hand:

* ``<!-- generated: settings -->`` becomes the settings table of ``dstreams/config.py``
  (``python -m dstreams.config`` prints the same table).
* The benchmark plots (``benchmarks/results/*.png``, written by ``python -m benchmarks``) are published as
  ``benchmark-plots/<name>.png`` (the Benchmarks page shows them), without a copy in ``docs/``.

``tests/unit/test_config.py`` and ``tests/integration/test_docs.py`` check that the pages keep their markers and that
the site builds with ``mkdocs build --strict``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PLOTS = ROOT / "benchmarks" / "results"
SETTINGS_MARKER = "<!-- generated: settings -->"


def render_generated(markdown: str) -> str:
    """``markdown`` with every generated-table marker replaced by its table."""
    if SETTINGS_MARKER in markdown:
        from dstreams import config

        markdown = markdown.replace(SETTINGS_MARKER, config.markdown_table())
    return markdown


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    return render_generated(markdown)


def on_files(files: Any, config: Any, **kwargs: Any) -> Any:
    from mkdocs.structure.files import File

    for png in sorted(PLOTS.glob("*.png")):
        files.append(File.generated(config, f"benchmark-plots/{png.name}", abs_src_path=str(png)))
    return files

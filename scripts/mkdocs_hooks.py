"""mkdocs hook: the site's front page is README.md itself, so the text lives once.

README.md sits at the repository root and links into docs/ as `docs/PAGE.md`, which GitHub resolves;
the docs pages link back to it as `../README.md`. In the site README.md becomes `index.md` inside
docs/, so both kinds of link are rewritten to where the site has them. Only links are touched.
"""

import re
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

README = Path(__file__).resolve().parent.parent / "README.md"


def on_files(files: Files, config: MkDocsConfig) -> Files:
    files.append(File.generated(config, "index.md", abs_src_path=str(README)))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    if page.file.src_uri == "index.md":
        return re.sub(r"\]\(docs/", "](", markdown)
    return re.sub(r"\]\((\.\./)+README\.md", "](index.md", markdown)

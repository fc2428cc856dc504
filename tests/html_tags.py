"""The tags and attributes of a piece of static HTML: what the escaping tests look at."""
from __future__ import annotations

from html.parser import HTMLParser


class Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.attrs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attrs += [k for k, _ in attrs]


def parse(markup: str) -> Tags:
    found = Tags()
    found.feed(markup)
    found.close()
    return found

"""Checks every link between the built site's pages, down to its anchor.

mkdocs checks that a linked page exists; this also checks that the #anchor does.
Usage: check_links.py SITE_DIR. Prints each broken link and exits 1 if there is one.
"""
import html.parser
import os
import sys
import urllib.parse


class Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids = set()
        self.hrefs = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        if tag == "a" and attrs.get("href") is not None:
            self.hrefs.append(attrs["href"])


def main(site):
    pages = {}
    for root, _, files in os.walk(site):
        for name in files:
            if name.endswith(".html"):
                path = os.path.join(root, name)
                page = Page()
                with open(path, encoding="utf-8") as f:
                    page.feed(f.read())
                pages[os.path.normpath(path)] = page
    broken = []
    for path, page in sorted(pages.items()):
        if os.path.basename(path) == "404.html":
            continue  # the theme's; its links are relative to wherever it is served
        for href in page.hrefs:
            url = urllib.parse.urlsplit(href)
            if url.scheme or url.netloc or href in ("", "#"):
                continue  # outside the site, or the theme's menu toggles
            target = path
            if url.path:
                target = os.path.normpath(os.path.join(os.path.dirname(path), url.path))
                if os.path.isdir(target):
                    target = os.path.join(target, "index.html")
            where = os.path.relpath(path, site)
            if not os.path.exists(target):
                broken.append(f"{where}: link to {href}: no such file in the site")
            elif url.fragment and target in pages and url.fragment not in pages[target].ids:
                broken.append(f"{where}: link to {href}: no anchor #{url.fragment} in "
                              f"{os.path.relpath(target, site)}")
    for line in broken:
        print(line)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

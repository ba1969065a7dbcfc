#!/usr/bin/env python3
"""Build kvq's text corpus from Debian documentation packages, deterministically.

Five domains, each extracted from one Debian package in sorted file order with a fixed cleaning:
  linux   linux-doc-6.1       reStructuredText under /usr/share/doc/linux-doc-6.1/Documentation
  python  python3.11-doc      reST sources under /usr/share/doc/python3.11/html/_sources
  perl    perl-doc            POD under /usr/share/perl/5.36/pod
  pgsql   postgresql-doc-15   HTML under /usr/share/doc/postgresql-doc-15/html, tags stripped
  gcide   dict-gcide          the GNU Collaborative International Dictionary of English (dictd format)

Every domain is split BY POSITION into train (first 92%), calib (next 4%) and eval (last 4%).
The train split goes to OUT/train/<domain>.txt (rebuilt, never committed). The calib and eval splits are
written to data/calib/<domain>.txt and data/eval/<domain>.txt, cut to at most --slice-bytes on a line
boundary, and data/MANIFEST records the sha256 of every committed slice.

Usage: scripts/build_corpus.py [--install] [--out build/corpus] [--data data]
"""
import argparse
import gzip
import hashlib
import html.parser
import os
import re
import subprocess
import sys

PACKAGES = ["linux-doc-6.1", "python3.11-doc", "perl-doc", "postgresql-doc-15", "dict-gcide"]
TRAIN_FRAC, CALIB_FRAC = 0.92, 0.04


def read_maybe_gz(path):
    opener = gzip.open if path.endswith((".gz", ".dz")) else open  # dictzip is gzip
    with opener(path, "rb") as f:
        return f.read().decode("utf-8", errors="replace")


def files_under(root, suffixes):
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            if name.endswith(suffixes):
                out.append(os.path.join(dirpath, name))
    return sorted(out)


def tidy(text):
    """Fixed cleaning shared by every domain: no CR, no trailing blanks, at most one blank line in a row."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\t", "    ")
    lines = [line.rstrip() for line in text.split("\n")]
    text = "\n".join(lines)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip("\n") + "\n"


class _HtmlText(html.parser.HTMLParser):
    BLOCK = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "table", "dt", "dd"}
    SKIP = {"script", "style", "head"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts, self.skip = [], 0

    def handle_starttag(self, tag, attrs):
        if tag in self.SKIP:
            self.skip += 1
        elif tag in self.BLOCK:
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if tag in self.SKIP:
            self.skip = max(0, self.skip - 1)
        elif tag in self.BLOCK:
            self.parts.append("\n")

    def handle_data(self, data):
        if not self.skip:
            self.parts.append(data)


def html_to_text(src):
    p = _HtmlText()
    p.feed(src)
    text = "".join(p.parts)
    # Collapse runs of spaces inside lines but keep line structure (code listings stay readable).
    return "\n".join(re.sub(r"[ \u00a0]+", " ", line).strip() for line in text.split("\n"))


def domain_linux():
    root = "/usr/share/doc/linux-doc-6.1/Documentation"
    return [read_maybe_gz(p) for p in files_under(root, (".rst", ".rst.gz", ".txt", ".txt.gz"))]


def domain_python():
    root = "/usr/share/doc/python3.11/html/_sources"
    return [read_maybe_gz(p) for p in files_under(root, (".txt", ".rst.txt"))]


def domain_perl():
    return [read_maybe_gz(p) for p in files_under("/usr/share/perl/5.36/pod", (".pod",))]


def domain_pgsql():
    root = "/usr/share/doc/postgresql-doc-15/html"
    return [html_to_text(read_maybe_gz(p)) for p in files_under(root, (".html",))]


def domain_gcide():
    raw = read_maybe_gz("/usr/share/dictd/gcide.dict.dz")
    # Drop the per-sense source tags ("[1913 Webster]") and the dictd header entries, dedent entries.
    lines = [l.strip() for l in raw.split("\n") if not re.fullmatch(r"\s*\[[^\]]*(Webster|WordNet|PJC|Century)[^\]]*\]\s*", l)]
    text = "\n".join(lines)
    start = text.find("\nA \\A\\")
    return [text[start + 1:] if start >= 0 else text]


DOMAINS = {"linux": domain_linux, "python": domain_python, "perl": domain_perl,
           "pgsql": domain_pgsql, "gcide": domain_gcide}


def cut_on_line(text, limit):
    if len(text.encode("utf-8")) <= limit:
        return text
    cut = text.encode("utf-8")[:limit].decode("utf-8", errors="ignore")
    return cut[: cut.rfind("\n") + 1]


def split_by_position(text):
    n = len(text)
    a = text.rfind("\n", 0, int(n * TRAIN_FRAC)) + 1
    b = text.rfind("\n", 0, int(n * (TRAIN_FRAC + CALIB_FRAC))) + 1
    return text[:a], text[a:b], text[b:]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read())
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--install", action="store_true", help="apt-get install the documentation packages first")
    ap.add_argument("--out", default="build/corpus", help="where the train split goes")
    ap.add_argument("--data", default="data", help="where the committed calib/eval slices go")
    ap.add_argument("--slice-bytes", type=int, default=900_000, help="cap per committed slice")
    args = ap.parse_args()

    if args.install:
        subprocess.run(["apt-get", "install", "-y", "-qq", *PACKAGES], check=True,
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})

    os.makedirs(os.path.join(args.out, "train"), exist_ok=True)
    for split in ("calib", "eval"):
        os.makedirs(os.path.join(args.data, split), exist_ok=True)
    manifest = []
    total = 0
    for name, extract in DOMAINS.items():
        docs = [tidy(d) for d in extract()]
        text = "\n".join(d for d in docs if d.strip())
        total += len(text.encode("utf-8"))
        train, calib, evl = split_by_position(text)
        with open(os.path.join(args.out, "train", name + ".txt"), "w", encoding="utf-8") as f:
            f.write(train)
        for split, part in (("calib", calib), ("eval", evl)):
            path = os.path.join(args.data, split, name + ".txt")
            with open(path, "w", encoding="utf-8") as f:
                f.write(cut_on_line(part, args.slice_bytes))
            manifest.append(f"{sha256(path)}  {split}/{name}.txt")
        print(f"{name:7s} {len(docs):6d} docs {len(text.encode('utf-8')) / 1e6:8.2f} MB "
              f"(train {len(train.encode('utf-8')) / 1e6:.2f} MB)", file=sys.stderr)
    with open(os.path.join(args.data, "MANIFEST"), "w") as f:
        f.write("\n".join(manifest) + "\n")
    print(f"total {total / 1e6:.1f} MB of text", file=sys.stderr)


if __name__ == "__main__":
    main()

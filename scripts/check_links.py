#!/usr/bin/env python3
"""Checks every relative link of the repository's markdown files: the file exists and, for a #fragment into a
markdown file, a heading of that slug exists (GitHub's slugs). Prints one line per broken link; exit 1 if any.
   scripts/check_links.py [ROOT]"""
import os, re, subprocess, sys

root = sys.argv[1] if len(sys.argv) > 1 else '.'
os.chdir(root)
files = [f for f in subprocess.check_output(['git', 'ls-files', '-co', '--exclude-standard', '*.md'], text=True)
         .split('\n') if f and os.path.isfile(f) and 'node_modules' not in f]


def slug(heading):
    s = heading.strip().lower()
    s = re.sub(r'[`*~]|<[^>]+>', '', s)  # code ticks, emphasis and tags do not reach the slug (underscores do)
    s = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', s)
    s = re.sub(r'[^\w\- ]', '', s)
    return s.replace(' ', '-')


anchors = {}


def anchors_of(path):
    if path not in anchors:
        seen, out = {}, set()
        in_code = False
        for line in open(path, encoding='utf-8'):
            if line.startswith('```'):
                in_code = not in_code
            if in_code:
                continue
            m = re.match(r'^(#{1,6})\s+(.*?)\s*#*\s*$', line)
            if m:
                s = slug(m.group(2))
                n = seen.get(s, 0)
                seen[s] = n + 1
                out.add(s if n == 0 else f'{s}-{n}')
        anchors[path] = out
    return anchors[path]


bad = 0
link = re.compile(r'\]\(([^)\s]+)\)')
for f in files:
    in_code = False
    for no, line in enumerate(open(f, encoding='utf-8'), 1):
        if line.startswith('```'):
            in_code = not in_code
        if in_code:
            continue
        for target in link.findall(line):
            if re.match(r'^[a-z]+:', target):
                continue
            path, _, frag = target.partition('#')
            full = os.path.normpath(os.path.join(os.path.dirname(f), path)) if path else f
            if not os.path.exists(full):
                print(f'{f}:{no}: no such file: {target}')
                bad += 1
            elif frag and full.endswith('.md') and frag not in anchors_of(full):
                print(f'{f}:{no}: no heading #{frag} in {full}')
                bad += 1
print(f'{len(files)} markdown files, {bad} broken links')
sys.exit(1 if bad else 0)

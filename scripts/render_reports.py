#!/usr/bin/env python3
"""Re-renders the generated part of each referee report in docs/reports from its results.json.gz with this kvq.

Each docs/reports/<name>.md is a hand-written preamble (what was run, where, the findings) followed by the report
kvq referee wrote, from its first line '- model: `...`' to the end. This replaces that second part with
`kvq referee --report-only --results <name>-results.json.gz` (which derives the bands, claims and the rest from the
run records again) and leaves the preamble as it is.
   scripts/render_reports.py [--check] KVQ [REPORT.md ...]     (default: the reports of the camps' runs)
--check writes nothing and exits 1 when a report is not what this kvq renders (a test: docs_reports)."""
import glob, os, subprocess, sys, tempfile

args = sys.argv[1:]
check = bool(args) and args[0] == '--check'
args = args[1:] if check else args
kvq = args[0]
# referee-ref and referee-ref-allwin predate the claims and the protocols: their reports stay as first written
reports = args[1:] or sorted(f for f in glob.glob('docs/reports/referee-camps-*.md') + ['docs/reports/referee-niah.md']
                                 if os.path.exists(f[:-3] + '-results.json.gz'))
stale = 0
for md in reports:
    results = md[:-3] + '-results.json.gz'
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([kvq, 'referee', '--report-only', '--results', results, '-o', out], check=True,
                       stdout=subprocess.DEVNULL)
        body = open(os.path.join(out, 'report.md'), encoding='utf-8').read().split('\n')
    start = next(i for i, l in enumerate(body) if l.startswith('- model: `'))
    old = open(md, encoding='utf-8').read().split('\n')
    cut = next(i for i, l in enumerate(old) if l.startswith('- model: `'))
    # a report whose sections sit one level down (under the preamble's "## The report") keeps them there
    if next((l for l in old[cut:] if l.startswith('#')), '').startswith('### '):
        body = ['#' + l if l.startswith('##') else l for l in body]
    new = old[:cut] + body[start:]
    changed = sum(a != b for a, b in zip(old, new)) + abs(len(old) - len(new))
    if check:
        stale += changed > 0
        print(f'{md}: {"differs from" if changed else "equals"} what this kvq renders')
        continue
    if new != old:
        open(md, 'w', encoding='utf-8').write('\n'.join(new))
    print(f'{md}: {changed} lines changed')
sys.exit(1 if stale else 0)

#!/usr/bin/env bash
# `trill report` on the RL tests' tiny MoE (tests/rl/fixture.sh): the report of a 5-step run and
# of two runs overlaid (router replay off with an int8 generator: flips and mismatch) holds every
# chart with one line per run; headless Chromium renders it at laptop width with no console error,
# every chart's SVG laid out and its marks drawn (sizes measured in the page), and a screenshot is
# kept; steps that go back are warned about and drawn once; 60,000 steps make a small page in
# bounded memory; a corrupt or empty line of metrics.jsonl is an error naming the line, and a
# partial last line (a run still writing) is left out.
# Usage: test_report.sh TRILL [SCREENSHOT.png]
set -euo pipefail
TRILL=$(realpath "$1")
SHOT=${2:-}
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/fixture.sh"
CHROMIUM=$(command -v chromium || true)
[ -n "$CHROMIUM" ] || fail "chromium is not installed (scripts/install-deps.sh installs it)"

kl=(algo.kl_coef=0.01 algo.kl_mode=loss) # every chart has values: the KL to the reference too
must_pass log_a "$TRILL" train "${COMMON[@]}" run_dir=a steps=5 eval.every=2 "${kl[@]}"
must_pass log_b "$TRILL" train "${COMMON[@]}" run_dir=b steps=5 eval.every=2 "${kl[@]}" router_replay=false generator.dtype=int8
must_pass log_r1 "$TRILL" report a --out one.html
grep -q "1 run, 5 steps -> one.html" log_r1 || fail "the report did not say what it read: $(cat log_r1)"
must_pass log_r2 "$TRILL" report a b --out two.html
[ -f a/report.html ] || must_pass log_r0 "$TRILL" report a
[ -f a/report.html ] || fail "trill report RUN did not write RUN/report.html"

# eval.jsonl: every held-out evaluation, before training (step 0), every 2 steps, after the last
$PY - a/eval.jsonl <<'PY' || fail "eval.jsonl does not hold every evaluation"
import json, sys
e = [json.loads(l) for l in open(sys.argv[1])]
assert [(x["step"], x["when"]) for x in e] == [(0, "before"), (2, "now"), (4, "now"), (5, "after")], e
assert all(0 <= x["pass1"] <= 1 and x["k"] == 2 and x["prompts"] == 4 for x in e), e
PY
# the page's structure: every chart, one polyline per run in each line chart, marks in the others
$PY - one.html two.html <<'PY' || fail "a chart is missing or empty"
import re, sys
LINES = ["reward", "accuracy", "eval", "loss", "kl", "response_len", "mismatch", "k3", "flip_rate", "throughput", "sync_bytes"]
for path, runs in ((sys.argv[1], 1), (sys.argv[2], 2)):
    html = open(path).read()
    assert "<script" not in html and "http" not in html.replace("http-equiv", ""), "the page fetches or runs something"
    assert "data-empty" not in html, "a chart without values"
    figs = dict(re.findall(r"<figure data-chart='([^']+)'>(.*?)</figure>", html, re.S))
    for name in LINES:
        lines = re.findall(r"<polyline [^>]*points='([^']*)'", figs[name])
        drawn = [p for p in lines if len(p.split()) >= (4 if name == "eval" else 2)]  # eval: steps 0, 2, 4, 5
        assert len(drawn) >= runs, (path, name, len(drawn))
    for r in range(runs):
        for name in (f"flips-{r}", f"hist-log_ratio-{r}", f"hist-weight_used-{r}"):
            assert figs[name].count("<rect") >= 3, (path, name)
        assert figs[f"time-{r}"].count("<polygon") == 4, (path, f"time-{r}")
    assert html.count("<details>") == runs, "the resolved config of each run"
    print(f"   {path}: {len(figs)} charts, each with its lines or marks for {runs} run(s)")
PY

# steps that go back (a run resumed from an older checkpoint appended to metrics.jsonl, or files
# joined by hand): a warning names the line, and each step is drawn once, from the later lines
mkdir -p resumed && cp a/metrics.jsonl resumed/
sed -n '3,5p' a/metrics.jsonl | sed 's/"reward":[^,]*,/"reward":5.0,/' >>resumed/metrics.jsonl
must_pass log_resumed "$TRILL" report resumed --out resumed.html
grep -q "resumed/metrics.jsonl: line 6: step 3 after step 5: the steps go back" log_resumed || fail "no warning where the steps go back: $(cat log_resumed)"
grep -q "1 run, 5 steps" log_resumed || fail "a repeated step was counted twice: $(cat log_resumed)"
$PY - resumed.html <<'PY' || fail "the resumed run's reward line is not steps 1 to 5 with the later records of 3 to 5"
import re, sys
fig = re.search(r"<figure data-chart='reward'>(.*?)</figure>", open(sys.argv[1]).read(), re.S).group(1)
pts = [tuple(map(float, p.split(","))) for p in re.search(r"<polyline [^>]*points='([^']*)'", fig).group(1).split()]
assert len(pts) == 5 and all(a[0] < b[0] for a, b in zip(pts, pts[1:])), pts
assert all(y == 34.0 for _, y in pts[2:]), pts  # 5.0, the highest reward, at the top of the plot
PY

# 60,000 steps (a 74 MB metrics.jsonl of the same lines, the figures varying, with a spike):
# each line is drawn in at most 1000 ranges of steps, so the page stays small, and the file is
# read line by line, so memory stays bounded by the page, not by the run: under 40 MB, about 12
# of them the program's own (200,000 steps, 247 MB, also took 12 MB, in 9.7 s of jansson parsing)
# (the sanitized build draws 20,000: the same ranges, a third of the reading)
# (ldd's output is read whole: under pipefail, grep -q leaving early can fail ldd with SIGPIPE)
SANITIZED=false
case "$(ldd "$TRILL")" in *libasan*) SANITIZED=true ;; esac
STEPS=60000
if $SANITIZED; then STEPS=20000; fi
mkdir -p long
$PY - a/metrics.jsonl long/metrics.jsonl $STEPS <<'PY'
import json, math, random, sys
line = json.loads(open(sys.argv[1]).readlines()[1])
varying = ("step", "reward", "loss", "kl_ref", "mismatch_mean_abs", "flip_token_frac")
for k in varying:
    line[k] = "@" + k
template = json.dumps(line, separators=(",", ":"))
for k in varying:
    template = template.replace(f'"@{k}"', "%(" + k + ")s")
n, r = int(sys.argv[3]), random.Random(0)
with open(sys.argv[2], "w") as f:
    for s in range(1, n + 1):
        f.write(template % {"step": s, "reward": 0.2 + 0.6 * s / n + 0.05 * math.sin(s / 500) + (0.5 if s == n // 3 else 0),
                            "loss": r.gauss(0, 0.01), "kl_ref": 0.01 * s / n + 1e-4 * r.random(),
                            "mismatch_mean_abs": 1e-3 * (1 + r.random()), "flip_token_frac": 0.05 * r.random()} + "\n")
PY
# its seconds and peak resident memory (KB, the kernel's accounting of the child)
must_pass log_long $PY -c 'import resource, subprocess, sys, time
t = time.monotonic()
subprocess.run(sys.argv[1:], check=True)
print(round(time.monotonic() - t, 1), resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)' "$TRILL" report long --out long.html >long.use
read -r seconds rss <long.use
grep -q "1 run, $STEPS steps" log_long || fail "$STEPS steps: $(cat log_long)"
bytes=$(stat -c %s long.html)
[ "$bytes" -lt 2000000 ] || fail "$STEPS steps make a page of $bytes bytes"
grep -q "steps 1 to $STEPS ($STEPS steps, drawn in 1000 ranges of steps: a line through each range's lowest and highest value, at most 2000 points)" \
    long.html || fail "the page does not say it was downsampled"
# (in the release build: ASan's shadow memory and quarantine would count too)
$SANITIZED || [ "$rss" -lt 40000 ] || fail "$STEPS steps took $rss KB of memory"
$PY - long.html $STEPS <<'PY' || fail "$STEPS steps: a line has too many points, or lost the reward spike"
import re, sys
html = open(sys.argv[1]).read()
figs = dict(re.findall(r"<figure data-chart='([^']+)'>(.*?)</figure>", html, re.S))
counts = [len(p.split()) for p in re.findall(r"points='([^']*)'", html)]
assert max(counts) <= 2002, max(counts)  # a time-split area: 1000 ranges and its two corners
pts = [tuple(map(float, p.split(","))) for p in re.search(r"points='([^']*)'", figs["reward"]).group(1).split()]
top = min(pts, key=lambda p: p[1])
n = int(sys.argv[2])
assert top[1] == 34.0 and abs(top[0] - (64 + 404 * (n // 3 - 1) / (n - 1))) < 0.1, top  # the spike at step n / 3, the highest reward
PY
echo "   $STEPS steps ($(($(stat -c %s long/metrics.jsonl) / 1000000)) MB of metrics.jsonl): a page of $((bytes / 1000)) KB in $seconds s," \
    "$((rss / 1024)) MB of memory"

# rendered by Chromium at 1366 px: no console error, every chart laid out and its marks non-empty
measure() { # measure PAGE: a copy with a script that measures every chart into the DOM, dumped
  $PY -c 'import sys; page, js = open(sys.argv[1]).read(), open(sys.argv[2]).read()
open(sys.argv[1] + ".check.html", "w").write(page.replace("</body>", "<script>" + js + "</script></body>"))' "$1" "$HERE/report_check.js"
  timeout -k 5 120 "$CHROMIUM" --headless --no-sandbox --disable-gpu --window-size=1366,900 --virtual-time-budget=3000 \
    --dump-dom "file://$PWD/$1.check.html" 2>/dev/null | grep -o '<pre id="report-check">[^<]*</pre>' | sed 's/<[^>]*>//g'
}
for page in one.html two.html long.html; do
  timeout -k 5 120 "$CHROMIUM" --headless --no-sandbox --disable-gpu --window-size=1366,900 --enable-logging=stderr --v=0 \
    --screenshot="$PWD/$page.png" "file://$PWD/$page" >"$page.console" 2>&1 || fail "chromium could not render $page"
  ! grep -E "CONSOLE|Uncaught" "$page.console" || fail "$page: console errors (above)"
  [ -s "$page.png" ] || fail "$page: no screenshot"
  result=$(measure "$page")
  [ -n "$result" ] || fail "$page: the measuring script left no result"
  $PY - "$result" <<'PY' || fail "$page: a chart is not laid out or has nothing drawn"
import json, sys
charts = json.loads(sys.argv[1])
bad = [c for c in charts if c["empty"] or c["w"] < 300 or c["h"] < 150 or c["marks"] < 1 or c["area"] <= 0]
assert charts and not bad, bad
print(f"   rendered: {len(charts)} charts, the narrowest {min(c['w'] for c in charts):.0f} x {min(c['h'] for c in charts):.0f} px, each with its marks drawn")
PY
done
[ -z "$SHOT" ] || cp two.html.png "$SHOT"

# metrics.jsonl errors name the line; a partial last line is left out
mkdir -p bad && cp a/metrics.jsonl bad/ && sed -i '3s/.*/{"step": oops}/' bad/metrics.jsonl
must_exit 1 log_bad "$TRILL" report bad --out bad.html
grep -q "bad/metrics.jsonl: line 3: " log_bad || fail "a corrupt line was not named: $(cat log_bad)"
cp a/metrics.jsonl bad/metrics.jsonl && sed -i '2s/.*//' bad/metrics.jsonl
must_exit 1 log_bad "$TRILL" report bad --out bad.html
grep -q "bad/metrics.jsonl: line 2: " log_bad || fail "an empty line was not named: $(cat log_bad)"
head -c -40 a/metrics.jsonl >bad/metrics.jsonl
must_pass log_partial "$TRILL" report bad --out partial.html
grep -q "1 run, 4 steps" log_partial || fail "a run in progress was not reported up to its last complete step: $(cat log_partial)"
echo "report test passed"

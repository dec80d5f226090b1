#!/bin/sh
# A trill external reward in POSIX sh (see README.md for the protocol): a length penalty.
#
# reward = 1 when the completion is at most LIMIT bytes long (default 400, or $LENGTH_LIMIT),
# else LIMIT / length, so longer answers earn proportionally less. Metric: "length".
#
# Only sh, sed and awk: the completion is cut out of the request with a regular expression
# over its JSON string, and its length is that of the escaped string (\n and \" count as two
# bytes), which is close enough for a penalty. A real reward should use a JSON parser
# (python3, or jq where it is installed).
limit=${LENGTH_LIMIT:-400}

while IFS= read -r line; do
    completion=$(printf '%s\n' "$line" |
        sed -n -E 's/.*"completion":"(([^"\\]|\\.)*)".*/\1/p')
    length=${#completion}
    reward=$(awk -v n="$length" -v l="$limit" 'BEGIN { printf "%.6f", (n <= l) ? 1 : l / n }')
    # printf is a shell builtin: each reply is written at once, nothing stays buffered.
    printf '{"reward": %s, "metrics": {"length": %d}}\n' "$reward" "$length"
done

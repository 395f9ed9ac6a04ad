#!/usr/bin/env bash
# The service benchmark's figure (docs/service.md): server/bench.sh's rows as horizontal bars
# of requests/s, the requests per server CPU-second written beside each bar, as an SVG on stdout.
#
#   server/bench.sh | tee results.txt; server/plot.sh results.txt > docs/perf/service.svg
#
# Reads only the rows ("... N req/s ... M req per server CPU-s"); other lines are skipped.
set -euo pipefail
awk '
/ req\/s / && / req per server CPU-s/ {
    line = $0
    match(line, /[0-9]+ req\/s/)
    rps = substr(line, RSTART, RLENGTH) + 0
    label = substr(line, 1, RSTART - 1)
    gsub(/ +$/, "", label); gsub(/  +/, " ", label)
    match(line, /[0-9]+ req per server CPU-s/)
    cpu = substr(line, RSTART, RLENGTH) + 0
    n++; L[n] = label; R[n] = rps; C[n] = cpu
    if (rps > max) max = rps
}
function esc(s) { gsub(/&/, "\\&amp;", s); gsub(/</, "\\&lt;", s); gsub(/>/, "\\&gt;", s); return s }
function group(n) { return n >= 1000000 ? sprintf("%.2f M", n / 1000000) : sprintf("%.0f k", n / 1000) }
END {
    if (n == 0) { print "plot.sh: no rows of server/bench.sh in the input" > "/dev/stderr"; exit 2 }
    left = 330; width = 420; row = 26; top = 40
    h = top + n * row + 30
    printf "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n", left + width + 170, h
    printf "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
    printf "<text x=\"10\" y=\"20\" font-size=\"14\">requests/s, one server core (server/bench.sh); beside each bar: requests per server CPU-second</text>\n"
    for (i = 1; i <= n; i++) {
        y = top + (i - 1) * row
        w = (max > 0) ? R[i] / max * width : 0
        color = (L[i] ~ /^turnstile/) ? "#2b6cb0" : "#a0aec0"
        printf "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%s</text>\n", left - 8, y + 15, esc(L[i])
        printf "<rect x=\"%d\" y=\"%d\" width=\"%.1f\" height=\"18\" fill=\"%s\"/>\n", left, y + 2, w, color
        printf "<text x=\"%.1f\" y=\"%d\">%s/s (%s per CPU-s)</text>\n", left + w + 6, y + 15, group(R[i]), group(C[i])
    }
    printf "</svg>\n"
}' "${1:--}"

# Figure 1 of "Transformers are RNNs": time and peak memory per sample of the
# attention alone (forward + backward) against sequence length, log-log, one line
# per variant. Points that ran out of memory or time are absent.
#
#   gnuplot -c plots/figure1.gp DATA.tsv OUT.png|OUT.svg ["TITLE"]
#
# DATA.tsv: tab-separated with a header row holding at least the columns kind,
# variant, len, status, per_sample_fwd_bwd_ms, peak_bytes_per_sample (`attnbench bench`
# writes it beside its JSON; `attnbench plot` writes one and calls this script).
# Variant names are single words (no spaces), as `attnbench plot` writes them.
#
# The script runs no shell command: DATA.tsv is read by gnuplot alone, so its name may
# hold quotes or any other character.
if (ARGC < 2) { print "usage: gnuplot -c figure1.gp DATA.tsv OUT.png|OUT.svg [TITLE]"; exit status 2 }
data = ARG1
out = ARG2
title = (ARGC >= 3) ? ARG3 : "Attention forward+backward per sample"

if (out[strlen(out)-2:] eq "svg") {
    set terminal svg size 1200,480 dynamic enhanced font "sans,12"
} else {
    set terminal pngcairo size 1200,480 enhanced font "sans,11"
}
set output out
set datafile separator "\t"
set datafile missing "NaN"
set datafile columnheaders

# Variants in order of first appearance, from the parallel-mode rows (collected by
# `stats`, whose using-expression appends each new name to the list).
variants = ""
add_word(list, w) = strstrt(" " . list, " " . w . " ") ? list : list . w . " "
stats data using (strcol("kind") eq "parallel" ? (variants = add_word(variants, strcol("variant")), 0) : 0) nooutput

set multiplot layout 1,2 title title
set logscale xy 2
set logscale y 10
set format x "2^{%L}"
set format y "10^{%L}"
set grid
set key bottom right
set xlabel "sequence length N"

ok(col) = (strcol("status") eq "ok") ? column(col) : NaN

set ylabel "time per sample (ms)"
plot for [v in variants] data using "len":(strcol("variant") eq v && strcol("kind") ne "recurrent" ? ok("per_sample_fwd_bwd_ms") : NaN) \
     with linespoints lw 2 pt 7 title v noenhanced

set ylabel "peak memory per sample (MiB)"
plot for [v in variants] data using "len":(strcol("variant") eq v && strcol("kind") ne "recurrent" ? ok("peak_bytes_per_sample") / 1048576.0 : NaN) \
     with linespoints lw 2 pt 7 title v noenhanced
unset multiplot

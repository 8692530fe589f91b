# Table 3 at CPU scale, as curves: the validation phone error rate (left) and the CTC
# loss (right: training loss per log interval as lines, validation loss as points, log
# y) of speech runs against the epoch, one colour per run.
#
#   python3 experiments/speech/curves.py RUN.json... --out PREFIX   (writes PREFIX.tsv, draws with this)
#   gnuplot -c plots/speech.gp DATA.tsv OUT.png|OUT.svg ["TITLE"]
#
# DATA.tsv: tab-separated with a header row holding the columns run, kind ("train" or
# "eval"), epoch, loss, per (per: NaN on train rows). Run names are single words.
#
# The script runs no shell command: DATA.tsv is read by gnuplot alone.
if (ARGC < 2) { print "usage: gnuplot -c speech.gp DATA.tsv OUT.png|OUT.svg [TITLE]"; exit status 2 }
data = ARG1
out = ARG2
title = (ARGC >= 3) ? ARG3 : "Phone recognition with CTC"

if (out[strlen(out)-2:] eq "svg") {
    set terminal svg size 1200,480 dynamic enhanced font "sans,12"
} else {
    set terminal pngcairo size 1200,480 enhanced font "sans,11"
}
set output out
set datafile separator "\t"
set datafile missing "NaN"
set datafile columnheaders

runs = ""
add_word(list, w) = strstrt(" " . list, " " . w . " ") ? list : list . w . " "
stats data using (runs = add_word(runs, strcol("run")), 0) nooutput
n = words(runs)

is(r, k, col) = (strcol("run") eq r && strcol("kind") eq k) ? column(col) : NaN

set multiplot layout 1,2 title title
set grid
set xlabel "epoch"

set ylabel "validation phone error rate (%)"
set yrange [0:100]
set key top right
plot for [i=1:n] data using "epoch":(100 * is(word(runs, i), "eval", "per")) with linespoints lw 2 pt 7 ps 0.4 lc i title word(runs, i) noenhanced

set yrange [*:*]
set logscale y 10
set ylabel "CTC loss (nats per utterance)"
set label 1 "lines: training loss (mean per log interval)\npoints: validation loss" at graph 0.02, graph 0.08 font ",9"
plot for [i=1:n] data using "epoch":(is(word(runs, i), "train", "loss")) with lines lw 2 lc i title word(runs, i) noenhanced, \
     for [i=1:n] data using "epoch":(is(word(runs, i), "eval", "loss")) with points pt 7 ps 0.5 lc i notitle
unset multiplot

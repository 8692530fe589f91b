# Figure 2 of "Transformers are RNNs": the loss of training runs against the gradient
# step, log y, one colour per run (line: the training loss averaged over each log
# interval; points: the loss on the fixed evaluation set).
#
#   gnuplot -c plots/figure2.gp DATA.tsv OUT.png|OUT.svg ["TITLE"]
#
# DATA.tsv: tab-separated with a header row holding the columns run, kind ("train" or
# "eval"), step, loss (`attnbench plot` writes it from the runs' train.json and calls
# this script). Run names are single words (no spaces), as `attnbench plot` writes them.
#
# The script runs no shell command: DATA.tsv is read by gnuplot alone, so its name may
# hold quotes or any other character.
if (ARGC < 2) { print "usage: gnuplot -c figure2.gp DATA.tsv OUT.png|OUT.svg [TITLE]"; exit status 2 }
data = ARG1
out = ARG2
title = (ARGC >= 3) ? ARG3 : "Training loss"

if (out[strlen(out)-2:] eq "svg") {
    set terminal svg size 900,560 dynamic enhanced font "sans,12"
} else {
    set terminal pngcairo size 900,560 enhanced font "sans,11"
}
set output out
set datafile separator "\t"
set datafile missing "NaN"
set datafile columnheaders

# Runs in order of first appearance (collected by `stats`, whose using-expression
# appends each new name to the list).
runs = ""
add_word(list, w) = strstrt(" " . list, " " . w . " ") ? list : list . w . " "
stats data using (runs = add_word(runs, strcol("run")), 0) nooutput
n = words(runs)

set title title
set logscale y 10
set format y "10^{%L}"
set grid
set key top right
set xlabel "gradient step"
set ylabel "cross-entropy loss (copied half)"

set label 1 "lines: training loss (mean per log interval)\npoints: loss on the fixed evaluation set" at graph 0.02, graph 0.08 font ",9"

is(r, k) = (strcol("run") eq r && strcol("kind") eq k) ? column("loss") : NaN

plot for [i=1:n] data using "step":(is(word(runs, i), "train")) with lines lw 2 lc i title word(runs, i) noenhanced, \
     for [i=1:n] data using "step":(is(word(runs, i), "eval")) with points pt 7 ps 0.6 lc i notitle

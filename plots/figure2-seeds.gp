# Figure 2 over several seeds: softmax's and linear's copy loss against the gradient
# step, each summarised over the seeds (log y). Lines: the geometric mean over the
# seeds of each run's median training loss per window (dropout on); bands: the
# smallest and largest run's; points: the geometric mean of the evaluation loss
# (fixed evaluation set, dropout off).
#
#   python3 experiments/copy/seeds.py --curve DATA.tsv [--window K] ...
#   gnuplot -c plots/figure2-seeds.gp DATA.tsv OUT.png|OUT.svg ["TITLE"]
#
# DATA.tsv: tab-separated with a header row holding the columns step, variant, train,
# train_lo, train_hi, eval, eval_lo, eval_hi (seeds.py --curve writes it).
if (ARGC < 2) { print "usage: gnuplot -c figure2-seeds.gp DATA.tsv OUT.png|OUT.svg [TITLE]"; exit status 2 }
data = ARG1
out = ARG2
title = (ARGC >= 3) ? ARG3 : "Copy loss over seeds"

if (out[strlen(out)-2:] eq "svg") {
    set terminal svg size 900,560 dynamic enhanced font "sans,12"
} else {
    set terminal pngcairo size 900,560 enhanced font "sans,11"
}
set output out
set datafile separator "\t"
set datafile missing "NaN"

set title title
set logscale y 10
set format y "10^{%L}"
set grid
set key top right
set xlabel "gradient step"
set ylabel "cross-entropy loss (copied half)"
set style fill transparent solid 0.18 noborder

set label 1 "lines: median training loss per window, geometric mean over seeds (band: min-max)\npoints: evaluation loss, geometric mean over seeds" at graph 0.02, graph 0.06 font ",9"

v(name, col) = (strcol("variant") eq name) ? column(col) : NaN

plot data using "step":(v("softmax", "train_lo")):(v("softmax", "train_hi")) with filledcurves lc 1 notitle, \
     data using "step":(v("linear", "train_lo")):(v("linear", "train_hi")) with filledcurves lc 2 notitle, \
     data using "step":(v("softmax", "train")) with lines lw 2 lc 1 title "softmax", \
     data using "step":(v("linear", "train")) with lines lw 2 lc 2 title "linear", \
     data using "step":(v("softmax", "eval")) with points pt 7 ps 0.7 lc 1 notitle, \
     data using "step":(v("linear", "eval")) with points pt 5 ps 0.7 lc 2 notitle

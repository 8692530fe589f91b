# The CPU-scale MNIST or CIFAR-10 runs (experiments/images/PROTOCOL.md): validation bits/dim against
# the epochs trained (left) and against the training time in CPU hours at 1 thread
# (right: the steps times each variant's CPU seconds per step), one colour per variant.
#
#   gnuplot -c plots/images-curves.gp DATA.tsv OUT.png|OUT.svg ["TITLE" [YMAX]]
#
# DATA.tsv: tab-separated with a header row holding run, epochs, cpu_h, bits_per_dim
# (`python3 experiments/images/table.py curves experiments/images/runs [cifar10]` writes
# it). YMAX: the top of the bits/dim axis (default 2.0, MNIST's; the first evaluations
# are far above the rest).
# Run names are single words. The script runs no shell command.
if (ARGC < 2) { print "usage: gnuplot -c images-curves.gp DATA.tsv OUT.png|OUT.svg [TITLE [YMAX]]"; exit status 2 }
data = ARG1
out = ARG2
title = (ARGC >= 3) ? ARG3 : "MNIST at CPU scale: validation bits/dim"
ymax = (ARGC >= 4) ? real(ARG4) : 2.0

if (out[strlen(out)-2:] eq "svg") {
    set terminal svg size 1100,480 dynamic enhanced font "sans,12"
} else {
    set terminal pngcairo size 1100,480 enhanced font "sans,11"
}
set output out
set datafile separator "\t"
set datafile columnheaders

runs = ""
add_word(list, w) = strstrt(" " . list, " " . w . " ") ? list : list . w . " "
stats data using (runs = add_word(runs, strcol("run")), 0) nooutput
n = words(runs)

set multiplot layout 1,2 title title
set grid
set key top right
set ylabel "validation bits/dim"
set yrange [*:ymax]
set xlabel "epochs"
plot for [i=1:n] data using (strcol("run") eq word(runs, i) ? column("epochs") : NaN):"bits_per_dim" \
     with linespoints pt 7 ps 0.5 lw 2 title word(runs, i)
set xlabel "training time, CPU hours at 1 thread"
plot for [i=1:n] data using (strcol("run") eq word(runs, i) ? column("cpu_h") : NaN):"bits_per_dim" \
     with linespoints pt 7 ps 0.5 lw 2 title word(runs, i)
unset multiplot

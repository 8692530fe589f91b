# Error against CPU time, one colour per run: the validation error of each evaluation as
# a line, the test error as a large open marker at the CPU time it was reached. A run
# whose line lies below another's at every time is the better use of the CPU.
#
#   python3 experiments/images/table.py pareto RUNS [mnist|cifar10] > DATA.tsv
#   python3 experiments/speech/curves.py RUN.json... --pareto PREFIX   (writes PREFIX.tsv, draws with this)
#   gnuplot -c plots/pareto.gp DATA.tsv OUT.png|OUT.svg TITLE YLABEL [XLABEL [YMIN [YMAX]]]
#
# DATA.tsv: tab-separated with a header row holding the columns run, kind ("valid" or
# "test"), cpu_h, value. Run names are single words.
#
# The script runs no shell command: DATA.tsv is read by gnuplot alone.
if (ARGC < 4) { print "usage: gnuplot -c pareto.gp DATA.tsv OUT.png|OUT.svg TITLE YLABEL [XLABEL [YMIN [YMAX]]]"; exit status 2 }
data = ARG1
out = ARG2
title = ARG3
ylabel = ARG4
xlabel = (ARGC >= 5) ? ARG5 : "CPU hours"
ymin = (ARGC >= 6 && ARG6 ne "") ? real(ARG6) : NaN
ymax = (ARGC >= 7 && ARG7 ne "") ? real(ARG7) : NaN

if (out[strlen(out)-2:] eq "svg") {
    set terminal svg size 760,520 dynamic enhanced font "sans,12"
} else {
    set terminal pngcairo size 760,520 enhanced font "sans,11"
}
set output out
set datafile separator "\t"
set datafile missing "NaN"
set datafile columnheaders

runs = ""
add_word(list, w) = strstrt(" " . list, " " . w . " ") ? list : list . w . " "
stats data using (runs = add_word(runs, strcol("run")), 0) nooutput
n = words(runs)

is(r, k) = (strcol("run") eq r && strcol("kind") eq k) ? column("value") : NaN

set title title noenhanced
set grid
set key top right
set xlabel xlabel noenhanced
set ylabel ylabel noenhanced
set xrange [0:*]
if (ymin == ymin && ymax == ymax) { set yrange [ymin:ymax] } else {
    if (ymin == ymin) { set yrange [ymin:*] }
    if (ymax == ymax) { set yrange [*:ymax] }
}
set label 1 "lines: validation, at each evaluation\nopen circles: test" at graph 0.02, graph 0.06 font ",9"
plot for [i=1:n] data using "cpu_h":(is(word(runs, i), "valid")) with linespoints lw 2 pt 7 ps 0.4 lc i \
         title word(runs, i) noenhanced, \
     for [i=1:n] data using "cpu_h":(is(word(runs, i), "test")) with points pt 6 ps 2.2 lw 2 lc i notitle

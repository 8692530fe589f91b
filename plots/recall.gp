# Associative recall (experiments/recall): recall accuracy against the recurrent
# state's bytes, the sequence length or the number of key-value pairs (log2 x), one
# line per variant.
#
#   gnuplot -c plots/recall.gp DATA.tsv OUT.png|OUT.svg state|length|pairs BLOCKS
#
# DATA.tsv (experiments/recall/table.py writes it): one block per variant, separated
# by two blank lines, each starting with the variant's name in double quotes, then
# rows "x<TAB>accuracy"; BLOCKS is their number. The script runs no shell command.
if (ARGC < 4) { print "usage: gnuplot -c recall.gp DATA.tsv OUT.png|OUT.svg state|length|pairs BLOCKS"; exit status 2 }
data = ARG1
out = ARG2
axis = ARG3
if (out[strlen(out)-2:] eq "svg") {
    set terminal svg size 800,520 dynamic enhanced font "sans,12"
} else {
    set terminal pngcairo size 800,520 enhanced font "sans,11"
}
set output out
set datafile separator "\t"
set key outside right top
set grid
set offsets graph 0.05, graph 0.05, 0, 0
set yrange [0:1.02]
set ylabel "recall accuracy (queried values)"
if (axis eq "state") {
    set logscale x 2
    set format x "%.0b %BB"
    set xlabel "recurrent state of one sequence, all layers"
    set title "Associative recall against state size (64 positions, 8 pairs; widths 64 and 128)"
} else {
    if (axis eq "pairs") {
        set logscale x 2
        set xlabel "key-value pairs in the row (each queried once)"
        set title "Associative recall against the pairs to hold (64 positions, width 64)"
    } else {
        set logscale x 2
        set xlabel "sequence length N"
        set title "Associative recall against sequence length (8 pairs, width 64)"
    }
}
blocks = int(ARG4)
plot for [i=0:blocks-1] data index i using 1:2 with linespoints lw 2 pt 7 title columnheader(1)

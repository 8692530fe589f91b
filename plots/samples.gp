# A grid of sampled (or completed) images, as `attnbench sample` draws it.
#
#   gnuplot -c plots/samples.gp GRID.tsv OUT.png|OUT.svg WIDTH HEIGHT ["TITLE"]
#
# GRID.tsv: one line per pixel of the whole grid, "x y r g b" (tab-separated, 0..255;
# y counts rows from the top), WIDTH x HEIGHT pixels in all: the images side by side
# with a one-pixel gap, `attnbench sample` writes it. Greyscale images have r = g = b.
# The script runs no shell command, so the file's name may hold any character.
if (ARGC < 4) { print "usage: gnuplot -c samples.gp GRID.tsv OUT.png|OUT.svg WIDTH HEIGHT [TITLE]"; exit status 2 }
data = ARG1
out = ARG2
w = int(ARG3)
h = int(ARG4)
title = (ARGC >= 5) ? ARG5 : "Samples"

# about 4 screen pixels per image pixel, within 400..1600 wide
scale = 4
if (w * scale > 1600) { scale = 1600.0 / w }
if (w * scale < 400) { scale = 400.0 / w }
pw = int(w * scale) + 40
ph = int(h * scale) + 70
if (out[strlen(out)-2:] eq "svg") {
    set terminal svg size pw,ph dynamic enhanced font "sans,12"
} else {
    set terminal pngcairo size pw,ph enhanced font "sans,11"
}
set output out
set datafile separator "\t"
set title title noenhanced
unset key
unset tics
unset border
unset colorbox
set size ratio -1
set xrange [-0.5:w - 0.5]
set yrange [h - 0.5:-0.5]
set margins 2, 2, 1, 3
plot data using 1:2:3:4:5 with rgbimage

set terminal svg size 900,400
set output 'mnist_out/metrics.svg'
set datafile separator ','
set multiplot layout 1,2
set xlabel 'epoch'
set title 'loss'
plot 'mnist_out/metrics.csv' using 1:2 with linespoints title 'train', '' using 1:4 with linespoints title 'test'
set title 'accuracy'
plot 'mnist_out/metrics.csv' using 1:3 with linespoints title 'train', '' using 1:5 with linespoints title 'test'
unset multiplot

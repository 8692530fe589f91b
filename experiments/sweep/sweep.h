/* The attention sweep (Figure 1) behind `attnbench bench`. */
#ifndef AB_SWEEP_H
#define AB_SWEEP_H

int sweep_main(int argc, char **argv, const char *command_line);

#endif

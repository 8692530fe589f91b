/* The training commands behind `attnbench train` and `attnbench generate`. */
#ifndef AB_TRAIN_CMDS_H
#define AB_TRAIN_CMDS_H

int train_main(int argc, char **argv, const char *command_line);
int generate_main(int argc, char **argv, const char *command_line);

#endif

/* The CLI's subcommands: each takes the arguments after its name. */
#ifndef AB_COMMANDS_H
#define AB_COMMANDS_H

int cmd_list(int argc, char **argv);
int cmd_op(int argc, char **argv);
int cmd_inputs(int argc, char **argv);
int cmd_plot(int argc, char **argv);

#endif

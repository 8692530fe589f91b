/* The CLI's commands: each takes the arguments after its name; the commands that
 * write a run document also take the whole command line, recorded in it. */
#ifndef AB_COMMANDS_H
#define AB_COMMANDS_H

int cmd_list(int argc, char **argv);
int cmd_op(int argc, char **argv);
int cmd_inputs(int argc, char **argv);
int cmd_plot(int argc, char **argv);
int cmd_features(int argc, char **argv);
int cmd_bench(int argc, char **argv, const char *command_line);
int cmd_train(int argc, char **argv, const char *command_line);
int cmd_generate(int argc, char **argv, const char *command_line);
int cmd_sample(int argc, char **argv, const char *command_line);
int cmd_decode(int argc, char **argv, const char *command_line);

#endif

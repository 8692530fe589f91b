/* The CLI's commands, one table (main.c): each takes the arguments after its name and
 * the whole command line, which the commands that write a run document record in it. */
#ifndef AB_COMMANDS_H
#define AB_COMMANDS_H

typedef int (*cli_command_fn)(int argc, char **argv, const char *command_line);

typedef struct {
    const char *name;
    cli_command_fn run;
    const char *synopsis; /* "bench CONFIG.json" */
    const char *summary;  /* one line or more, for attnbench --help */
} cli_command;

/* The commands, in the order --help lists them; NULL-named at the end. */
extern const cli_command cli_commands[];

int cmd_list(int argc, char **argv, const char *command_line);
int cmd_op(int argc, char **argv, const char *command_line);
int cmd_inputs(int argc, char **argv, const char *command_line);
int cmd_plot(int argc, char **argv, const char *command_line);
int cmd_features(int argc, char **argv, const char *command_line);
int cmd_bench(int argc, char **argv, const char *command_line);
int cmd_merge(int argc, char **argv, const char *command_line);
int cmd_train(int argc, char **argv, const char *command_line);
int cmd_generate(int argc, char **argv, const char *command_line);
int cmd_sample(int argc, char **argv, const char *command_line);
int cmd_decode(int argc, char **argv, const char *command_line);

#endif

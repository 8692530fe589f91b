/* The list of training tasks the program knows, made here at the top so that the
 * driver (experiments/driver/) includes no task. A new task is its folder under
 * experiments/tasks/ plus one line in task_list.c. */
#ifndef AB_TASK_LIST_H
#define AB_TASK_LIST_H

/* Installs every task (task_kinds_install): main calls it first, and so does every
 * test that parses a training config. */
void task_list_install(void);

#endif

/* The one list of training tasks (task_list.h). */
#include "task_list.h"

#include "copy_task.h"
#include "frames_task.h"
#include "images_task.h"
#include "recall_task.h"
#include "sequences_task.h"
#include "speech_task.h"
#include "task.h"

static const task_kind *const KINDS[] = {&copy_task_kind,   &sequences_task_kind, &frames_task_kind,
                                         &images_task_kind, &speech_task_kind,    &recall_task_kind};

void task_list_install(void) { task_kinds_install(KINDS, (int)(sizeof KINDS / sizeof *KINDS)); }

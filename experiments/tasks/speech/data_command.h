/* The commands of a data directory (Kaldi's "extended filename": a wav.scp value
 * ending in '|', e.g. "sph2pipe -f wav -p -c 1 X.wv1 |"), run under a process-wide
 * policy that the user sets (attnbench --allow-commands, --command-timeout,
 * --command-max-mb):
 *
 * - Consent: a command runs only when the policy allows it (off by default), so that a
 *   data directory or a checkpoint naming one, from someone else, runs nothing on the
 *   user's machine unasked. A refusal is one line naming the entry, the command and
 *   the option.
 * - Its own process group, with /dev/null as its standard input: every process of it
 *   (a pipeline, a command it starts in the background) is killed when it ends, when it
 *   runs past the time limit, when it writes more than the output limit, and when
 *   attnbench is interrupted (dc_kill_all from a signal handler). Its shell is also
 *   killed by the kernel if attnbench dies without a chance to (kill -9: the parent-death
 *   signal); the rest of a pipeline then ends on its closed pipe.
 * - Limits: a command running longer than timeout_s, or writing more than max_bytes to
 *   its standard output, is killed and refused (AB_EINVAL naming the limit).
 *
 * Thread-safe: several commands may run at once (features are computed in parallel). */
#ifndef AB_SPEECH_DATA_COMMAND_H
#define AB_SPEECH_DATA_COMMAND_H

#include <stdbool.h>
#include <stddef.h>

typedef struct {
    bool allowed;     /* false (default): every command is refused */
    double timeout_s; /* 60 (default): wall-clock seconds one command may run */
    size_t max_bytes; /* 1 GiB (default): what one command may write to its standard output */
} dc_policy;

#define DC_DEFAULT_TIMEOUT_S 60.0
#define DC_DEFAULT_MAX_MB 1024

void dc_policy_default(dc_policy *p);
/* The process's policy (dc_policy_default until set). Set it before commands run. */
void dc_set_policy(const dc_policy *p);
void dc_get_policy(dc_policy *p);

/* Runs `cmd` with /bin/sh -c under the policy: its standard output in *out (malloc'd,
 * *n bytes; the caller frees), its standard error's last line in messages. `where`
 * names the entry in messages (e.g. "data/train/wav.scp:12 (utterance X)"). AB_EINVAL:
 * refused by the policy, killed at a limit, killed by a signal, a non-zero exit status,
 * no output; AB_EIO: a pipe or the shell could not be made; AB_ENOMEM. */
int dc_run(const char *cmd, const char *where, unsigned char **out, size_t *n);

/* Kills (SIGKILL) the process group of every command running now. Async-signal-safe:
 * for the handlers of SIGINT, SIGTERM and SIGHUP. */
void dc_kill_all(void);

#endif

/* main.c — `trainyard-engine`: argument parsing, rank discovery, signals.
 *
 *   trainyard-engine --spec FILE --workdir DIR [--resume CKPT_DIR] [--threads N]
 *   trainyard-engine tokenize --model DIR [...]     (the tokenizer's CLI)
 *   trainyard-engine dump-rows --spec FILE [--eval] (the batch rows, for tests)
 *   trainyard-engine generate|logits --model DIR ... (generate.c)
 *   trainyard-engine adapter-fields  (adapter_config.json's fields, peftcfg.c)
 *
 * Rank and world size come from TY_RANK / TY_WORLD_SIZE / TY_LOCAL_RANK, or
 * Slurm's or Open MPI's variables (dist.c; docs/engine.md, Ranks); world > 1
 * starts MPI here. Everything else is in train.c; this file only turns the
 * command line into train_args. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist.h"
#include "events.h"
#include "generate.h"
#include "peftcfg.h"
#include "train.h"
#include "tyopen.h"
#ifdef TY_HAVE_TOKENIZER
#include "tokenizer.h"
#endif

static void on_stop(int sig)
{
    (void)sig;
    train_stop_requested = 1;
}

/* How long an OpenMP thread spins waiting for the next parallel region
 * before it sleeps: libgomp's default, 300 000 pause loops (milliseconds
 * on current x86), is ruinous on a shared machine. A step forks and joins
 * a few hundred times; with another process on one of the cores, threads
 * spinning at a join burn the slices the late thread needs, and the step
 * slowed by as much as 2x against a short spin. 10 000 loops still covers
 * the gaps between back-to-back regions of a step on a quiet machine. The
 * CPU kernels run on their own pool, which waits the same bound
 * (kernels/cpu/cpu_pool.c); oneDNN's bf16 matmul still runs OpenMP regions. */
#define TY_OMP_SPINCOUNT "10000"

/* libgomp reads its settings once, when it loads, before main: a bounded
 * spin (when the user chose neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT)
 * takes one exec of this same binary with the setting in its
 * environment. Not under valgrind, whose /proc/self/exe is its tool. */
static void bound_omp_spin(char **argv)
{
    const char *pre = getenv("LD_PRELOAD");
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT") || (pre && strstr(pre, "vgpreload")))
        return;
    if (setenv("GOMP_SPINCOUNT", TY_OMP_SPINCOUNT, 1)) return;
    execv("/proc/self/exe", argv);
    /* Exec failed: run as we are, with libgomp's default. */
}

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: trainyard-engine --spec FILE --workdir DIR [--resume CKPT_DIR] [--threads N]\n"
        "       trainyard-engine tokenize --model DIR [--add-special] [--decode]\n"
        "       trainyard-engine dump-rows --spec FILE [--eval]\n"
        "       trainyard-engine generate (--model DIR | --config FILE) [--weights FILE] [--adapter DIR]\n"
        "                        (--prompt TEXT | --prompt-ids IDS) [--max-tokens N] [--temperature T]\n"
        "                        [--top-p P] [--seed S] [--stop STR]... [--ignore-eos] [--threads N]\n"
        "       trainyard-engine logits (model options as generate) --prompt-ids IDS [--kv]\n"
        "       trainyard-engine adapter-fields\n"
        "       trainyard-engine --help | --version | SUBCOMMAND --help\n");
}

static int is_help(const char *a)
{
    return !strcmp(a, "--help") || !strcmp(a, "-h");
}

static int dump_rows_main(int argc, char **argv)
{
    const char *spec = NULL;
    int eval = 0;
    for (int i = 1; i < argc; i++) {
        if (is_help(argv[i])) {
            printf("usage: trainyard-engine dump-rows --spec FILE [--eval]\n");
            return 0;
        }
        if (!strcmp(argv[i], "--spec") && i + 1 < argc)
            spec = argv[++i];
        else if (!strcmp(argv[i], "--eval"))
            eval = 1;
        else
            spec = NULL, i = argc;
    }
    if (!spec) {
        fprintf(stderr, "usage: trainyard-engine dump-rows --spec FILE [--eval]\n");
        return 2;
    }
    return train_dump_rows(spec, eval);
}

/* The field table of adapter_config.json (peftcfg.c), one tab-separated
 * line per field: name, what is done with it, why. */
static int adapter_fields_main(int argc, char **argv)
{
    if (argc > 1 && is_help(argv[1])) {
        printf("usage: trainyard-engine adapter-fields\n"
               "prints each adapter_config.json field PEFT writes: name, honoured / ignored / "
               "refused unless VALUES, why\n");
        return 0;
    }
    if (argc > 1) {
        fprintf(stderr, "trainyard-engine adapter-fields: takes no arguments\n"
                        "usage: trainyard-engine adapter-fields\n");
        return 2;
    }
    peft_fields_print(stdout);
    return 0;
}

int main(int argc, char **argv)
{
    bound_omp_spin(argv);
    if (argc > 1 && !strcmp(argv[1], "dump-rows")) return dump_rows_main(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "adapter-fields"))
        return adapter_fields_main(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "--version")) {
        printf("trainyard-engine %s\n", TY_VERSION);
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "generate")) return generate_main(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "logits")) return logits_main(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "tokenize")) {
#ifdef TY_HAVE_TOKENIZER
        return tokenizer_cli_main(argc - 1, argv + 1);
#else
        fprintf(stderr,
                "trainyard-engine: this build has no tokenizer (engine/tokenizer was not built)\n");
        return 2;
#endif
    }
    train_args a = {0};
    for (int i = 1; i < argc; i += 2) { /* every option takes one value */
        const char *o = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (is_help(o)) {
            usage(stdout);
            return 0;
        }
        if (!v) {
            fprintf(stderr, "trainyard-engine: %s needs a value\n", o);
            usage(stderr);
            return 2;
        }
        if (!strcmp(o, "--spec"))
            a.spec_path = v;
        else if (!strcmp(o, "--workdir"))
            a.workdir = v;
        else if (!strcmp(o, "--resume"))
            a.resume = v;
        else if (!strcmp(o, "--threads")) {
            char *end;
            long n = strtol(v, &end, 10);
            if (*end || n < 1 || n > 4096) {
                fprintf(stderr, "trainyard-engine: --threads must be a positive integer\n");
                return 2;
            }
            a.threads = (int)n;
        } else {
            fprintf(stderr, "trainyard-engine: unknown option %s\n", o);
            usage(stderr);
            return 2;
        }
    }
    dist_env de;
    ty_err derr = {0};
    int bad_env = dist_env_read(&de, &derr);
    a.rank = bad_env ? 0 : de.rank;
    a.world = bad_env ? 1 : de.world;
    a.local_rank = bad_env ? 0 : de.local_rank;
    ev_init(a.rank);
    if (bad_env) {
        ev_error(derr.msg);
        return 2;
    }
    if (ev_set_output(getenv("TY_EVENTS_PATH"), a.world)) {
        fprintf(stderr, "trainyard-engine: TY_EVENTS_PATH %s: %s\n", getenv("TY_EVENTS_PATH"),
                strerror(errno));
        return 1;
    }
    if (!a.spec_path || !a.workdir) {
        usage(stderr);
        ev_error("--spec and --workdir are required");
        return 2;
    }
    /* Set by the server: the directories job specs may read from (its
     * --allowed-roots plus its input cache). Our own work directory joins
     * them for the spec, resume checkpoints and what we write there. Every
     * input file is then opened through ty_open_input, which refuses
     * anything that leads outside. */
    const char *roots = getenv("TY_ALLOWED_ROOTS");
    if (roots && *roots) {
        char wd[PATH_MAX];
        if (!realpath(a.workdir, wd)) {
            char m[PATH_MAX + 128];
            snprintf(m, sizeof m, "--workdir %s: %s", a.workdir, strerror(errno));
            ev_error(m);
            return 2;
        }
        size_t n = strlen(roots) + strlen(wd) + 2;
        char *all = malloc(n);
        ty_err e = {0};
        if (!all || (snprintf(all, n, "%s:%s", roots, wd), ty_open_set_roots(all, &e))) {
            ev_error("out of memory");
            return 2;
        }
        free(all);
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    /* A vanished event reader must not kill us mid-checkpoint. */
    signal(SIGPIPE, SIG_IGN);
    sigaction(SIGUSR1, &sa, NULL); /* what mpirun forwards (docs/engine.md, Ranks) */
    /* Under trainyard serve we die with the server: SIGTERM when it goes
     * (we checkpoint and stop, and its next start adopts that checkpoint
     * from disk); under a launcher the server is watched (dist.c). */
    int sup = dist_supervise(&de, &derr);
    if (sup < 0) {
        ev_error(derr.msg);
        return 1;
    }
    a.supervised = sup;
    /* A supervisor that is not our parent (the server's Slurm executor)
     * owns pruning as well, but we do not die with it. */
    const char *sup_far = getenv("TY_SUPERVISED");
    if (sup_far && !strcmp(sup_far, "1")) a.supervised = 1;
    /* The MPI world (world > 1): after the arguments, so bad usage never
     * waits for peers. */
    if (dist_init(&de, &argc, &argv, &a.coll, &derr)) {
        ev_log("error: %s", derr.msg);
        ev_error(derr.msg);
        return 2;
    }
    int code = train_run(&a);
    if (code == 0) dist_finish(a.coll);
    return code;
}

/* ckpt.h — checkpoint directories of DESIGN §6: manifest, verification, pruning.
 *
 * A checkpoint is <workdir>/checkpoints/step-NNNNNN/ holding its files and a
 * MANIFEST.json listing each file's bytes and sha256. The manifest is
 * written last (MANIFEST.json.tmp, fsync, rename, fsync dir): a directory
 * without a manifest is an incomplete checkpoint and does not exist. What
 * goes into the files is the trainer's business (train.c); this module only
 * knows directories, sums and the manifest format. */
#ifndef TY_CKPT_H
#define TY_CKPT_H

#include <stdint.h>
#include "tyerr.h"

#define CKPT_FORMAT "trainyard-checkpoint/1"

/* "<root>/checkpoints/step-NNNNNN" and its workdir-relative form. */
void ckpt_dir_name(char *out, size_t n, const char *workdir, int64_t step);
void ckpt_rel_name(char *out, size_t n, int64_t step);

/* Makes an empty directory for step's checkpoint (removing any incomplete
 * or older copy of the same step). */
int ckpt_begin(const char *dir, ty_err *err);
/* Hashes files[0..n) (paths relative to dir), writes MANIFEST.json last by
 * atomic rename; *total_bytes = sum of the files and the manifest. */
int ckpt_commit(const char *dir, int64_t step, const char *const *files, int n,
                uint64_t *total_bytes, ty_err *err);
/* Reads and checks a manifest: format, step, every file's size and sha256
 * ("checkpoint corrupt: <file> sha256 mismatch"). *step gets its step. */
int ckpt_verify(const char *dir, int64_t *step, ty_err *err);
/* Deletes what keep_last / keep_best do not keep (ty_retention_select,
 * common/retention.h: the server's rule too): committed checkpoints beyond
 * the newest keep_last (0 = keep all) that are not among the keep_best
 * lowest "eval_loss" of their trainer_state.json (those without one never
 * count as best), and incomplete ones older than the newest committed;
 * never the newest committed. */
int ckpt_prune(const char *workdir, int keep_last, int keep_best, ty_err *err);

#endif

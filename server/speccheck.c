/* speccheck.c — what admission (admit.c) checks of a job's files beyond
 * the spec parser, in two steps. Paths: against this server's roots, a
 * file:// store against its store roots. Model: model.init with the
 * engine's own config reader (hfconfig_parse), a local model.path's
 * config.json, and a lora.adapter's adapter_config.json with its adapter
 * reader, so an architecture the engine would refuse (n_embd -64, n_head
 * 0) is a 400 now instead of a failed job later, bounded by --max-params. */
#include "server.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "hfconfig.h"
#include "jobspec.h"
#include "peftcfg.h"

static int check_init(const srv_config *c, const jobspec *spec, ty_err *err)
{
    if (!spec->model_init) return 0;
    model_config mc;
    ty_err e = {0};
    if (hfconfig_parse(spec->model_init, "model.init", &mc, &e)) {
        char field[sizeof err->field];
        snprintf(field, sizeof field, "model.init%s%.100s", e.field[0] ? "." : "", e.field);
        return ty_err_field(err, TY_EINVAL, field, "%s", e.msg);
    }
    uint64_t n = hfconfig_param_count(&mc);
    hfconfig_free(&mc);
    if (c->max_params > 0 && n > (uint64_t)c->max_params)
        return ty_err_field(err, TY_EINVAL, "model.init",
                            "model.init: %llu parameters is more than this server's --max-params "
                            "%lld",
                            (unsigned long long)n, (long long)c->max_params);
    return 0;
}

/* dir/name parsed, when dir is a local path and the file is there already
 * and holds a JSON object; else NULL. What is not there yet (or a remote
 * URI) is left to the engine, which checks the same when it starts; a file
 * that does not parse is the engine's to report too (its messages are kept
 * free of file contents). */
static json_t *local_json(const char *dir, const char *name)
{
    if (!dir || dir[0] != '/') return NULL;
    char path[4200];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) return NULL;
    json_t *o = json_load_file(path, 0, NULL);
    if (json_is_object(o)) return o;
    json_decref(o);
    return NULL;
}

/* err for the file's own error e: the field is where:file.<e's field> (or
 * just where when e names none; at most 123 characters in all, e's field
 * cut first), the message names where's value p. */
static int file_error(ty_err *err, const char *where, const char *file, const char *p,
                      const ty_err *e)
{
    char field[sizeof err->field];
    if (e->field[0])
        snprintf(field, sizeof field, "%s:%s.%.*s", where, file,
                 123 - (int)(strlen(where) + strlen(file) + 2), e->field);
    else
        snprintf(field, sizeof field, "%s", where);
    return ty_err_field(err, TY_EINVAL, field, "%s %s: %s", where, p, e->msg);
}

/* A local model.path whose config.json is there already: read by the
 * engine's own reader too, so a family or setting the engine does not
 * support (model_type "gemma2", rope_scaling, mlp_bias, ...) is a 400
 * naming the config field and the reason at submit, not a failed job.
 * A directory that is not there yet (or a remote URI) is left to the
 * engine, which checks the same when it starts. */
static int check_model_dir(const jobspec *spec, ty_err *err)
{
    json_t *o = local_json(spec->model_path, "config.json");
    if (!o) return 0;
    model_config mc;
    ty_err e = {0};
    int rc = hfconfig_parse(o, "config.json", &mc, &e);
    json_decref(o);
    if (rc) return file_error(err, "model.path", "config.json", spec->model_path, &e);
    hfconfig_free(&mc);
    return 0;
}

/* A local lora.adapter whose adapter_config.json is there already: read
 * by the engine's own reader (peftcfg.h), so a PEFT field the engine would
 * refuse (a field it does not know, a setting it cannot make exact) is a 400
 * naming lora.adapter:adapter_config.json.<field> now, not a failed job.
 * What is not there yet is left to the engine, which checks the same. */
static int check_adapter(const jobspec *spec, ty_err *err)
{
    const char *p = spec->lora_adapter;
    json_t *o = local_json(p, "adapter_config.json");
    if (!o) return 0;
    lora_cfg c;
    ty_err e = {0};
    lora_cfg_default(&c);
    int rc = lora_cfg_from_peft(&c, o, "adapter_config.json", &e);
    json_decref(o);
    if (rc) return file_error(err, "lora.adapter", "adapter_config.json", p, &e);
    if (c.r != spec->lora_r)
        return ty_err_field(err, TY_EINVAL, "lora.r", "lora.adapter %s has r = %d but lora.r is %d",
                            p, c.r, spec->lora_r);
    if (c.bias != spec->lora_bias)
        return ty_err_field(err, TY_EINVAL, "lora.bias",
                            "lora.adapter %s has bias \"%s\" but lora.bias is \"%s\"", p,
                            jobspec_bias_names[c.bias], jobspec_bias_names[spec->lora_bias]);
    if (c.use_dora != spec->lora_use_dora)
        return ty_err_field(err, TY_EINVAL, "lora.use_dora",
                            "lora.adapter %s has use_dora %s but lora.use_dora is %s", p,
                            c.use_dora ? "true" : "false", spec->lora_use_dora ? "true" : "false");
    int same = c.n_save == spec->n_save;
    for (int i = 0; same && i < c.n_save; i++)
        same = !strcmp(c.save[i], spec->save[i]);
    if (!same)
        return ty_err_field(err, TY_EINVAL, "lora.modules_to_save",
                            "lora.adapter %s has other modules_to_save than lora.modules_to_save",
                            p);
    return 0;
}

/* A dataset that exists already must be a regular file: a FIFO would block
 * the engine, a device never ends. (The engine refuses them too, for
 * what appears after submit.) */
static int check_kind(const char *field, const char *p, ty_err *err)
{
    struct stat st;
    if (!p || (p[0] != '/' && strncmp(p, "file://", 7))) return 0;
    const char *local = p[0] == '/' ? p : p + 7;
    if (stat(local, &st) != 0 || S_ISREG(st.st_mode)) return 0;
    return ty_err_field(err, TY_EINVAL, field, "%s: %s is %s, not a regular file", field, local,
                        S_ISDIR(st.st_mode)                          ? "a directory"
                        : S_ISFIFO(st.st_mode)                       ? "a FIFO"
                        : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device"
                                                                     : "a special file");
}

int srv_spec_check_paths(const srv_config *c, const jobspec *spec, ty_err *err)
{
    int rc;
    if ((rc = jobspec_check_roots(spec, c->allowed_roots, err))) return rc;
    if ((rc = check_kind("dataset.train", spec->train, err))) return rc;
    if ((rc = check_kind("dataset.eval", spec->eval, err))) return rc;
    return jobspec_check_store_roots(spec, c->store_roots, err);
}

int srv_spec_check_model(const srv_config *c, const jobspec *spec, ty_err *err)
{
    int rc;
    if ((rc = check_model_dir(spec, err))) return rc;
    if ((rc = check_adapter(spec, err))) return rc;
    return check_init(c, spec, err);
}

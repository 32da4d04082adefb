/* test_fetch.c — what the scheduler relies on to move a job's downloads
 * off its thread: fetch_needed says which starts download (a
 * remote model or dataset URI, or a resume checkpoint whose files are gone
 * and that a store can bring back) without contacting any store, and a
 * fetch cancelled with fetch_handle_cancel fails fetch_prepare_start at
 * once with TY_ESTATE, naming the input, leaving nothing in the cache.
 * The real transfers are covered by storage_e2e.fetch_off_scheduler. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tyassert.h"
#include "server.h"
#include "tyutil.h"
#include "fetch.h"
#include "state.h"
#include "upload.h"

#define STEPS ",\"hyperparameters\":{\"max_steps\":4}}"
static const char *LOCAL =
    "{\"model\":{\"path\":\"/models/m\"},\"dataset\":{\"train\":\"/data/t.jsonl\"}" STEPS;
static const char *REMOTE_TRAIN =
    "{\"model\":{\"path\":\"/models/m\"},\"dataset\":{\"train\":\"s3://bkt/data/t.jsonl\"}" STEPS;
static const char *REMOTE_EVAL = "{\"model\":{\"path\":\"/models/m\"},\"dataset\":{\"train\":"
                                 "\"/data/t.jsonl\",\"eval\":\"az://c/e.jsonl\"}" STEPS;
static const char *REMOTE_MODEL =
    "{\"model\":{\"path\":\"gs://bkt/models/m\"},\"dataset\":{\"train\":\"/data/t.jsonl\"}" STEPS;
static const char *STORED = "{\"model\":{\"path\":\"/models/m\"},\"dataset\":{\"train\":"
                            "\"/data/t.jsonl\"},\"checkpoint\":{\"store\":\"s3://bkt/runs\"}" STEPS;

/* A job row's spec as the scheduler reads it (srv_job_spec). The specs
 * above all parse: a failure here is the test's own. */
static jobspec *row_spec(const char *text)
{
    static jobspec specs[8];
    static int n;
    db_job j = {.id = 1, .spec = (char *)text};
    ty_err err = {0};
    jobspec *s = &specs[n++ % 8];
    jobspec_free(s);
    CHECK(srv_job_spec(&j, s, &err) == 0, "%s", err.msg);
    return s;
}

static int entries(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

int main(void)
{
    char tmpl[] = "/tmp/ty-fetch-XXXXXX";
    CHECK(mkdtemp(tmpl) != NULL);
    static srv s; /* large: keep it off the stack */
    snprintf(s.cfg.data_dir, sizeof s.cfg.data_dir, "%s", tmpl);
    snprintf(s.jobs_dir, sizeof s.jobs_dir, "%s/jobs", tmpl);
    /* Credentials that exist but lead nowhere: nothing may contact it. */
    snprintf(s.cfg.store.s3_access_key_id, sizeof s.cfg.store.s3_access_key_id, "AKIDTEST");
    snprintf(s.cfg.store.s3_secret_access_key, sizeof s.cfg.store.s3_secret_access_key, "x");
    snprintf(s.cfg.store.s3_region, sizeof s.cfg.store.s3_region, "us-east-1");
    snprintf(s.cfg.store.s3_endpoint, sizeof s.cfg.store.s3_endpoint, "http://127.0.0.1:9");

    /* Which starts download. */
    CHECK(!fetch_needed(&s, 1, row_spec(LOCAL), NULL));
    CHECK(fetch_needed(&s, 1, row_spec(REMOTE_TRAIN), NULL));
    CHECK(fetch_needed(&s, 1, row_spec(REMOTE_EVAL), NULL));
    CHECK(fetch_needed(&s, 1, row_spec(REMOTE_MODEL), NULL));
    /* A damaged row: the start is refused with a reason naming the job. */
    {
        db_job bad = {.id = 7, .spec = (char *)"not json"};
        jobspec sp;
        ty_err e = {0};
        CHECK(srv_job_spec(&bad, &sp, &e) == TY_ECORRUPT && strstr(e.msg, "job 7"), "%s", e.msg);
        db_job noexec = {.id = 8, .spec = (char *)"{\"model\":{\"path\":\"/m\"}}"};
        CHECK(srv_job_spec(&noexec, &sp, &e) == TY_ECORRUPT && strstr(e.msg, "dataset"), "%s",
              e.msg);
    }
    /* A resume: only with a store and without the local manifest. */
    CHECK(!fetch_needed(&s, 1, row_spec(LOCAL), "checkpoints/step-000004"));
    CHECK(fetch_needed(&s, 1, row_spec(STORED), "checkpoints/step-000004"));
    char ck[PATH_MAX + 64], manifest[PATH_MAX + 96];
    snprintf(ck, sizeof ck, "%s/1/checkpoints/step-000004", s.jobs_dir);
    snprintf(manifest, sizeof manifest, "%s/MANIFEST.json", ck);
    ty_err err = {0};
    CHECK(ty_mkdir_p(ck, &err) == 0);
    CHECK(fetch_needed(&s, 1, row_spec(STORED), "checkpoints/step-000004"));
    FILE *f = fopen(manifest, "w");
    CHECK(f && fputs("{}", f) >= 0 && fclose(f) == 0);
    CHECK(!fetch_needed(&s, 1, row_spec(STORED), "checkpoints/step-000004"));

    /* A cancelled fetch fails at once, before any request, and says which
     * input it was fetching. Cancelling twice is harmless. */
    fetch_handle *h = fetch_handle_new();
    CHECK(h != NULL);
    fetch_handle_cancel(h);
    fetch_handle_cancel(h);
    char *resume = NULL, *spec_text = (char *)"unset";
    int rc = fetch_prepare_start(&s, 1, row_spec(REMOTE_TRAIN), &resume, &spec_text, h, &err);
    CHECK(rc == TY_ESTATE);
    CHECK(spec_text == NULL);
    CHECK(strstr(err.msg, "dataset.train") && strstr(err.msg, "s3://bkt/data/t.jsonl"));
    CHECK(!strcmp(err.field, "dataset.train"));
    char cache[PATH_MAX + 16];
    snprintf(cache, sizeof cache, "%s/cache", tmpl);
    CHECK(entries(cache) == 0);
    fetch_handle_free(h);
    fetch_handle_free(NULL);
    fetch_handle_cancel(NULL);

    /* Without a handle nothing is remote here: the engine gets the job's
     * spec, every default filled in, and it parses to the same. */
    ty_err_clear(&err);
    rc = fetch_prepare_start(&s, 1, row_spec(LOCAL), &resume, &spec_text, NULL, &err);
    CHECK(rc == 0 && spec_text && strstr(spec_text, "/data/t.jsonl"));
    jobspec back;
    memset(&back, 0, sizeof back);
    CHECK(spec_text && jobspec_parse_text(spec_text, strlen(spec_text), &back, &err) == 0 &&
              back.max_steps == 4 && !strcmp(back.train, "/data/t.jsonl") && back.seq_len == 256,
          "%s", err.msg);
    jobspec_free(&back);
    free(spec_text);

    CHECK(ty_rm_rf(tmpl, &err) == 0);
    puts("server_unit.fetch: ok");
    return ty_summary("fetch");
}

/* jobspec_schema_dump.c — prints common/jobspec.c's field table
 * (jobspec_schema) as JSON on stdout, for jobspec_openapi.py to hold
 * against openapi.yaml's JobSpec. */
#include <stdio.h>
#include <stdlib.h>

#include "jobspec.h"

int main(void)
{
    json_t *rows = jobspec_schema();
    char *text = rows ? json_dumps(rows, JSON_INDENT(1)) : NULL;
    json_decref(rows);
    if (!text) {
        fputs("jobspec_schema_dump: out of memory\n", stderr);
        return 1;
    }
    puts(text);
    free(text);
    return 0;
}

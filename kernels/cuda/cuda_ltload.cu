/* cuda_ltload.cu — finds and loads libcublasLt at run time (cuda_lt.cuh).
 *
 * Where it looks, in order, stopping at the first that loads:
 *   $TY_CUBLASLT            a path to the library (tests/gpu/run.sh, users
 *                           with it somewhere unusual);
 *   libcublasLt.so.<major>  the loader's own search (LD_LIBRARY_PATH,
 *                           ld.so.cache), <major> being the version of the
 *                           headers we were compiled with;
 *   TY_CUBLASLT_BUILD_DIR   the build tree's copy (kernels/cuda/CMakeLists.txt
 *                           fetches it when the build machine has a GPU);
 *   /usr/local/cuda/lib64   a full toolkit.
 * The outcome (success or the message listing every attempt) is kept, so
 * a second context does not search again. */
#define KN_LT_NO_RENAME
#include "cuda_lt.cuh"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

kn_lt_api kn_lt;

#define KN_STR2(x) #x
#define KN_STR(x) KN_STR2(x)
#define LT_SONAME "libcublasLt.so." KN_STR(CUBLAS_VER_MAJOR)

static pthread_once_t lt_once = PTHREAD_ONCE_INIT;
static char lt_msg[sizeof(((ty_err *)0)->msg)]; /* empty on success */

/* Appends one failed attempt to lt_msg. */
static void lt_note(const char *what)
{
    size_t n = strlen(lt_msg);
    snprintf(lt_msg + n, sizeof lt_msg - n, "%s%s", n ? "; " : "", what);
}

static void *lt_try(const char *path)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        lt_note(e ? e : path);
    }
    return h;
}

static void lt_load_once(void)
{
    void *h = NULL;
    const char *env = getenv("TY_CUBLASLT");
    if (env && *env)
        h = lt_try(env);
    if (!h)
        h = lt_try(LT_SONAME);
#ifdef TY_CUBLASLT_BUILD_DIR
    if (!h)
        h = lt_try(TY_CUBLASLT_BUILD_DIR "/" LT_SONAME);
#endif
    if (!h)
        h = lt_try("/usr/local/cuda/lib64/" LT_SONAME);
    if (!h) {
        char tried[sizeof lt_msg];
        snprintf(tried, sizeof tried, "%s", lt_msg);
        snprintf(lt_msg, sizeof lt_msg, "cuBLASLt not found (set TY_CUBLASLT to its path): %.400s",
                 tried);
        return;
    }
    lt_msg[0] = 0;
#define KN_LT_SYM(f)                                                                               \
    if (!(kn_lt.f = (decltype(&::f))dlsym(h, #f))) {                                               \
        snprintf(lt_msg, sizeof lt_msg, "%s has no %s", LT_SONAME, #f);                             \
        return;                                                                                    \
    }
    KN_LT_FUNCS(KN_LT_SYM)
#undef KN_LT_SYM
}

int kn_lt_load(ty_err *err)
{
    pthread_once(&lt_once, lt_load_once);
    return lt_msg[0] ? ty_err_set(err, TY_EINVAL, "%s", lt_msg) : 0;
}

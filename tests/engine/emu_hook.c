/* emu_hook.c — links the emulated CUDA backend into trainyard-engine-emu.
 *
 * kernels.c reaches kn_cuda_emu_backend only through a weak reference (the
 * TY_KERNELS=cuda-emu hook), which does not pull it out of its static
 * library; this strong one does. Test builds only: the shipped
 * trainyard-engine does not contain the emulation. */
#include "backend.h"

const kn_backend *const ty_emu_hook_backend = &kn_cuda_emu_backend;

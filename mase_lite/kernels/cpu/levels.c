/* What the library runs on this CPU, for its binding (mase_lite/kernels/cpu/__init__.py). */
#include "common.h"

/* Bit i set where level i runs on this CPU (the OS saving the vector registers included). */
int cpu_kernels_levels(void) { return cpu_levels(); }

/* Whether the int8 dot products of LEVEL_AVX512 take VNNI. */
int cpu_kernels_vnni(void) { return cpu_vnni(); }

/* Whether the library runs its threads on OpenMP (built with -fopenmp). It then shares the OpenMP runtime torch has
 * loaded (same soname), so its threads are torch's own team: no second set of threads competes for the cores with
 * torch's spinning ones. */
int cpu_kernels_openmp(void) { return built_with_openmp(); }

/* TEMPORARY skeleton */
#include "variant.h"
typedef int fmap_placeholder_t;

/* placeholder until written */
#include "reference.h"
typedef int ref_placeholder_t;

/* A second translation unit: a static function with the same name as none
 * in features.c, plus calls back into features.c. */
#include "features.h"

static int helper(int x) { return 2 * x; }
int other_file_twice(int x) { return helper(x); }
int other_file_calls_back(int n) { return fib(n) + square(n); }
int (*other_square_ptr(void))(int) { return square; }

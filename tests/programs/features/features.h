int square(int x);
int other_file_twice(int x);
int other_file_calls_back(int n);
int (*other_square_ptr(void))(int);
int fib(int n);

/* thread_x86_64.S: the runtime's threads and stack switches (x86-64).
 *
 *   long __bunkai_clone(flags, stack_top, tls, fn, arg, child_tid)
 *       a raw thread running fn(arg) on stack_top; it exits when fn
 *       returns (with CLONE_CHILD_CLEARTID the kernel then clears
 *       *child_tid and wakes it). The parent gets the child's TID or
 *       -errno.
 *   uint64_t __bunkai_call_on(stack_top, fn, arg)
 *       runs fn(arg) on another stack and comes back with its result.
 *   noreturn __bunkai_run_on(sp, fn, arg, exit_sp)
 *       a remote thread enters the program: fn(arg) on the program's
 *       stack, then its result to __bunkai_remote_exit on exit_sp, a stack
 *       of ours: once home has the result, glibc there may give the
 *       program's stack to another thread at once (its pages then move to
 *       that thread's host), so nothing may run on it any more.
 *   __bunkai_restorer
 *       the signal trampoline (rt_sigreturn) for the runtime's handlers:
 *       on a node it must lie inside the library's text, the range Syscall
 *       User Dispatch lets through.
 */
        .text

        .globl __bunkai_clone
        .hidden __bunkai_clone
        .type __bunkai_clone,@function
__bunkai_clone:
        and $-16, %rsi
        sub $16, %rsi
        mov %rcx, 0(%rsi)          /* fn and arg travel on the child's stack */
        mov %r8, 8(%rsi)
        mov %rdx, %r8              /* tls */
        xor %edx, %edx             /* parent_tid */
        mov %r9, %r10              /* child_tid */
        mov $56, %eax              /* SYS_clone */
        syscall
        test %rax, %rax
        jnz 1f
        .cfi_startproc
        .cfi_undefined rip
        xor %ebp, %ebp
        pop %rax
        pop %rdi
        call *%rax
        mov $60, %eax              /* SYS_exit (this thread only) */
        xor %edi, %edi
        syscall
        hlt
        .cfi_endproc
1:      ret
        .size __bunkai_clone, .-__bunkai_clone

        .globl __bunkai_call_on
        .hidden __bunkai_call_on
        .type __bunkai_call_on,@function
__bunkai_call_on:
        push %rbp
        mov %rsp, %rbp
        and $-16, %rdi
        mov %rdi, %rsp
        mov %rdx, %rdi
        call *%rsi
        mov %rbp, %rsp
        pop %rbp
        ret
        .size __bunkai_call_on, .-__bunkai_call_on

        .globl __bunkai_run_on
        .hidden __bunkai_run_on
        .type __bunkai_run_on,@function
__bunkai_run_on:
        .cfi_startproc
        .cfi_undefined rip
        and $-16, %rdi
        mov %rdi, %rsp
        xor %ebp, %ebp
        mov %rcx, %r12             /* exit_sp: callee-saved, fn keeps it */
        mov %rdx, %rdi
        call *%rsi
        mov %rax, %rdi
        and $-16, %r12
        mov %r12, %rsp
        call __bunkai_remote_exit
        hlt
        .cfi_endproc
        .size __bunkai_run_on, .-__bunkai_run_on

        .globl __bunkai_restorer
        .hidden __bunkai_restorer
        .type __bunkai_restorer,@function
__bunkai_restorer:
        mov $15, %eax              /* SYS_rt_sigreturn */
        syscall
        hlt
        .size __bunkai_restorer, .-__bunkai_restorer

        .section .note.GNU-stack,"",@progbits

/*
 * trampoline_x86_64.S - entry of the shared-library manager (§3.4).
 *
 * Rules: this runs between a caller and the function it called, in someone
 * else's program. It must leave every argument register exactly as the
 * caller set it (%rdi %rsi %rdx %rcx %r8 %r9, %xmm0-7, and %al, which tells a
 * varargs callee how many vector registers carry arguments), must not touch
 * the caller's stack arguments or return address, and must end with a tail
 * jump so the callee returns straight to the caller. %r10 (static chain) is
 * kept too.
 *
 * Entry: the caller called a stub, the stub jumped through its slot to the
 * function's lazy entry, `call __bunkai_resolve` (stubs.rs): the return
 * address on top of the stack is __bunkai_lazy + 5 * (id + 1), the
 * caller's below it. Popping the first leaves the stack as the caller left
 * it, and gives the id: (address - __bunkai_lazy) / 5 - 1.
 *
 * Frame: push %rbp makes %rsp 16-byte aligned (the caller's call pushed 8
 * bytes), then 192 bytes of spill space keep it aligned for the C call.
 */
        .text
        .globl  __bunkai_resolve
        .hidden __bunkai_resolve
        .type   __bunkai_resolve,@function
        .p2align 4
__bunkai_resolve:
        .cfi_startproc
        popq    %r11
        /* From here the return address at 0(%rsp) is the caller's: CFA is
         * %rsp+8 again, as .cfi_startproc says. */
        pushq   %rbp
        .cfi_def_cfa_offset 16
        .cfi_offset %rbp, -16
        movq    %rsp, %rbp
        .cfi_def_cfa_register %rbp
        subq    $192, %rsp
        movq    %rdi, 0(%rsp)
        movq    %rsi, 8(%rsp)
        movq    %rdx, 16(%rsp)
        movq    %rcx, 24(%rsp)
        movq    %r8, 32(%rsp)
        movq    %r9, 40(%rsp)
        movq    %rax, 48(%rsp)
        movq    %r10, 56(%rsp)
        movdqa  %xmm0, 64(%rsp)
        movdqa  %xmm1, 80(%rsp)
        movdqa  %xmm2, 96(%rsp)
        movdqa  %xmm3, 112(%rsp)
        movdqa  %xmm4, 128(%rsp)
        movdqa  %xmm5, 144(%rsp)
        movdqa  %xmm6, 160(%rsp)
        movdqa  %xmm7, 176(%rsp)
        leaq    __bunkai_lazy(%rip), %rcx
        movq    %r11, %rax
        subq    %rcx, %rax
        xorl    %edx, %edx
        movl    $5, %ecx
        divq    %rcx
        leal    -1(%rax), %edi
        call    __bunkai_lookup
        movq    %rax, %r11
        movq    0(%rsp), %rdi
        movq    8(%rsp), %rsi
        movq    16(%rsp), %rdx
        movq    24(%rsp), %rcx
        movq    32(%rsp), %r8
        movq    40(%rsp), %r9
        movq    48(%rsp), %rax
        movq    56(%rsp), %r10
        movdqa  64(%rsp), %xmm0
        movdqa  80(%rsp), %xmm1
        movdqa  96(%rsp), %xmm2
        movdqa  112(%rsp), %xmm3
        movdqa  128(%rsp), %xmm4
        movdqa  144(%rsp), %xmm5
        movdqa  160(%rsp), %xmm6
        movdqa  176(%rsp), %xmm7
        leave
        .cfi_def_cfa %rsp, 8
        jmpq    *%r11
        .cfi_endproc
        .size   __bunkai_resolve, .-__bunkai_resolve

        .section .note.GNU-stack,"",@progbits

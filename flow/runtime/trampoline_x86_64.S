/*
 * trampoline_x86_64.S: the common trampoline of woven sleds (bunkai_flow.h
 * §4; weave.c says how stubs and guards reach it). Rules: runtime.h.
 *
 * It saves the registers and the flags and, unless the slot's weave is
 * vector-free, the vector state (XSAVE, every component the OS enabled),
 * then calls __bunkai_flow_dispatch(frame, xsave area or 0) (weave.c), and
 * restores everything. It reads __bunkai_flow_modes, __bunkai_flow_xsize,
 * __bunkai_flow_xlo and __bunkai_flow_xhi, which weave.c sets up.
 *
 * [rsp] = slot (pushed by the stub), [rsp+8] = the sled's return address.
 * A guard pushes -1 (full state) or -2 (vector-free) instead of a slot.
 */
/* The general registers pushed at entry, back in reverse order (all but
 * rax and the flags, which the two exits restore each their own way). */
        .macro POP_SAVED
        pop     %r15
        pop     %r14
        pop     %r13
        pop     %r12
        pop     %r11
        pop     %r10
        pop     %r9
        pop     %r8
        pop     %rdi
        pop     %rsi
        pop     %rbp
        pop     %rbx
        pop     %rdx
        pop     %rcx
        .endm

        .text
        .globl  __bunkai_flow_tramp
        .hidden __bunkai_flow_tramp
        .type   __bunkai_flow_tramp,@function
        .p2align 4
__bunkai_flow_tramp:
        pushfq
        push    %rax
        push    %rcx
        push    %rdx
        push    %rbx
        push    %rbp
        push    %rsi
        push    %rdi
        push    %r8
        push    %r9
        push    %r10
        push    %r11
        push    %r12
        push    %r13
        push    %r14
        push    %r15
        cld
        mov     %rsp, %rbp                      /* the frame */
        mov     128(%rsp), %rax                 /* frame->slot */
        test    %rax, %rax
        js      3f                              /* from a guard: -1 full, -2 vector-free */
        mov     __bunkai_flow_modes(%rip), %rcx
        testb   $1, (%rcx,%rax)                 /* BKF_WEAVE_NO_VECTOR */
        jnz     2f
1:
        sub     __bunkai_flow_xsize(%rip), %rsp
        and     $-64, %rsp
        mov     %rsp, %rbx                      /* the XSAVE area, kept across the call */
        xor     %eax, %eax
        mov     %rax, 512(%rbx)
        mov     %rax, 520(%rbx)
        mov     %rax, 528(%rbx)
        mov     %rax, 536(%rbx)
        mov     %rax, 544(%rbx)
        mov     %rax, 552(%rbx)
        mov     %rax, 560(%rbx)
        mov     %rax, 568(%rbx)
        mov     __bunkai_flow_xlo(%rip), %eax
        mov     __bunkai_flow_xhi(%rip), %edx
        xsave64 (%rbx)
        mov     %rbp, %rdi
        mov     %rbx, %rsi
        call    __bunkai_flow_dispatch
        mov     __bunkai_flow_xlo(%rip), %eax
        mov     __bunkai_flow_xhi(%rip), %edx
        xrstor64 (%rbx)
        mov     %rbp, %rsp
        POP_SAVED                               /* r15 .. rcx */
        pop     %rax
        popfq
        lea     8(%rsp), %rsp                   /* the slot; lea leaves the flags alone */
        ret
3:
        cmp     $-2, %rax
        jne     1b
        /* vector-free handler: no XSAVE area (the handler and what it
         * calls, the runtime, are built with -mgeneral-regs-only) */
2:
        and     $-16, %rsp
        mov     %rbp, %rdi
        xor     %esi, %esi
        call    __bunkai_flow_dispatch
        mov     %rbp, %rsp
        POP_SAVED                               /* r15 .. rcx */
        /* the arithmetic flags back without popfq (microcoded, a fifth of
         * the fast path): CF PF AF ZF SF through sahf, OF by an add that
         * overflows exactly when it was set. DF stays clear, as the ABI
         * has it wherever compiled code can be; no other flag changed. */
        movzbl  8(%rsp), %eax
        shl     $8, %eax
        testb   $8, 9(%rsp)                     /* OF is bit 11 */
        setnz   %al
        add     $0x7f, %al
        sahf
        pop     %rax
        lea     16(%rsp), %rsp                  /* the flags and the slot */
        ret
        .size   __bunkai_flow_tramp, .-__bunkai_flow_tramp

        .section .note.GNU-stack,"",@progbits

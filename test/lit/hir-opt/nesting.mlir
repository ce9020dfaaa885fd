// Input nested deeper than 64 brackets is refused with a located error at the
// bracket that goes too deep, not a RecursionError traceback. What is printed
// must read back, so the limit holds for the generic form too, where a region
// nests two levels (`({`): 32 modules are the deepest that print.
// RUN: %python -c "print('builtin.module {' * 150 + '}' * 150)" | not hir-opt 2>&1 | filecheck %s --check-prefix=OPS
// RUN: %python -c "print('func.func @f() attributes {a = ' + '[' * 400 + ']' * 400 + '} {\n func.return\n}')" | not hir-opt 2>&1 | filecheck %s --check-prefix=ARRAY
// RUN: %python -c "print('func.func @f() attributes {a = ' + '{a = ' * 100 + '1' + '}' * 100 + '} {\n func.return\n}')" | not hir-opt 2>&1 | filecheck %s --check-prefix=DICT
// RUN: %python -c "print('builtin.module {' * 32 + '}' * 32)" | hir-opt -p hir-lowering,cse,canonicalize,dce --print-op-generic | filecheck %s --check-prefix=DEEPEST
// RUN: %python -c "print('builtin.module {' * 33 + '}' * 33)" | not hir-opt --print-op-generic 2>&1 | filecheck %s --check-prefix=TOO-DEEP-PRINTED
// Brackets in comments and strings do not count.
// RUN: %python -c "print('// ' + '[' * 100 + '\nfunc.func @f() attributes {s = \"' + '{' * 100 + '\"} {\n func.return\n}')" | hir-opt | filecheck %s --check-prefix=TEXT

// 65 `builtin.module {` of 16 characters each: the 65th brace is at column 65 * 16.
// OPS: <stdin>:1:1040: error: nesting too deep: more than 64 levels of nested brackets (the parser's limit)
// OPS-NEXT: {{^}}builtin.module {builtin.module {
// OPS-NEXT: {{^ +\^$}}
// OPS-NOT: Traceback

// `{a = ` opens level 1, the 64th `[` is at column 31 + 63.
// ARRAY: <stdin>:1:95: error: nesting too deep: more than 64 levels of nested brackets (the parser's limit)
// ARRAY-NOT: Traceback

// DICT: <stdin>:1:{{[0-9]+}}: error: nesting too deep
// DICT-NOT: Traceback

// DEEPEST-COUNT-32: "builtin.module"() ({
// DEEPEST-NOT: "builtin.module"

// 33 modules read (33 levels), but their generic form nests 66: the error is at the 33rd.
// TOO-DEEP-PRINTED: <stdin>:1:513: error: nesting too deep: the generic form of this op nests more than 64 levels of brackets, more than the parser reads
// TOO-DEEP-PRINTED-NOT: Traceback

// TEXT: func.func @f() attributes {s = "{{[{]+}}"}

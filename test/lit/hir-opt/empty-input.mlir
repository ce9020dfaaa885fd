// Input without any operation (empty, or only comments) is an empty module, as in
// mlir-opt. This file has only comments.
// RUN: hir-opt %s | filecheck %s
// RUN: hir-opt %s -p hir-lowering --print-op-generic | filecheck %s --check-prefix=GENERIC
// RUN: %python -c "print(end='')" | hir-opt | filecheck %s
// An empty chunk of --split-input-file is an empty module too.
// RUN: %python -c "print('// -----\nfunc.func @f() {\n  func.return\n}\n// -----\n// only a comment')" | hir-opt --split-input-file | filecheck %s --check-prefix=SPLIT

// CHECK: {{^}}builtin.module {
// CHECK-NEXT: {{^}}}
// CHECK-NOT: {{.}}

// GENERIC: "builtin.module"() ({
// GENERIC: }) : () -> ()
// GENERIC-NOT: "

// SPLIT: {{^}}builtin.module {
// SPLIT-NEXT: {{^}}}
// SPLIT: // -----
// SPLIT-NEXT: builtin.module {
// SPLIT-NEXT: func.func @f()
// SPLIT: // -----
// SPLIT-NEXT: {{^}}builtin.module {
// SPLIT-NEXT: {{^}}}

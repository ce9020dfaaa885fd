// RUN: hir-opt %S/../../../examples/matmul_m.mlir -p hir-lowering | filecheck %s --check-prefix=ROWS
// RUN: hir-opt %S/../../../examples/matmul_n.mlir -p hir-lowering | filecheck %s --check-prefix=COLUMNS

// pr4147's Matmul_M: stream-parallel on M, each iteration multiplies a row of A by
// the whole B.

// ROWS-LABEL: func.func @matmul_m(
// ROWS-SAME:      %[[A:[^:]+]]: !fusion.tensor<[?, ?], f32>, %[[B:[^:]+]]: !fusion.tensor<[?, ?], f32>)
// ROWS:         %[[C:[^ ]+]] = hir.allocate(%[[N:[^,)]+]]{{.*}}
// ROWS-NEXT:    scf.for {{.*}} to %[[N]]
// ROWS:         scf.for %[[I:[^ ]+]] = {{.*}} to %[[N]]
// ROWS:           %[[A_I:[^ ]+]] = hir.alias_select %[[A]][0 = %[[I]]]
// ROWS-NEXT:      %[[C_I:[^ ]+]] = hir.alias_select %[[C]][0 = %[[I]]]
// ROWS-NEXT:      hir.matmul ins(%[[A_I]], %[[B]] : !fusion.tensor<[?], f32>, !fusion.tensor<[?, ?], f32>) outs(%[[C_I]] : !fusion.tensor<[?], f32>)

// pr4147's Matmul_N: stream-parallel on N, each iteration multiplies the whole A by a
// column of B (B is sliced, not A).

// COLUMNS-LABEL: func.func @matmul_n(
// COLUMNS-SAME:      %[[A:[^:]+]]: !fusion.tensor<[?, ?], f32>, %[[B:[^:]+]]: !fusion.tensor<[?, ?], f32>)
// COLUMNS:         %[[C:[^ ]+]] = hir.allocate(%{{[^,]+}}, %[[N:[^,)]+]])
// COLUMNS-NEXT:    scf.for {{.*}} to %[[N]]
// COLUMNS:         scf.for %[[I:[^ ]+]] = {{.*}} to %[[N]]
// COLUMNS:           %[[B_I:[^ ]+]] = hir.alias_select %[[B]][1 = %[[I]]]
// COLUMNS-NEXT:      %[[C_I:[^ ]+]] = hir.alias_select %[[C]][1 = %[[I]]]
// COLUMNS-NEXT:      hir.matmul ins(%[[A]], %[[B_I]] : !fusion.tensor<[?, ?], f32>, !fusion.tensor<[?], f32>) outs(%[[C_I]] : !fusion.tensor<[?], f32>)

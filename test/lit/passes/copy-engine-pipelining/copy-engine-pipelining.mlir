// RUN: hir-opt %s --split-input-file -p 'stream-parallel,copy-engine-pipelining{share_slices=false}' | filecheck %s
// RUN: hir-opt %s --split-input-file -p stream-parallel,copy-engine-pipelining | filecheck %s --check-prefix=SHARED
// RUN: hir-opt %s --split-input-file -p stream-parallel,copy-engine-pipelining > %t && hir-opt %s --split-input-file -p stream-parallel,copy-engine-pipelining,copy-engine-pipelining | diff %t -
// After per-stream-buffers the work slices its buffers by the pool stream's index, which
// only the pool streams' order makes safe: such a loop stays on the pool streams.
// RUN: hir-opt %s --split-input-file -p stream-parallel,per-stream-buffers,copy-engine-pipelining | filecheck %s --check-prefix=POOL

// AG+GEMM on the copy engines. The stream loops of stream-parallel become one loop on
// the caller's stream, software-pipelined: before the loop the allgather of chunk 0;
// iteration i issues the allgather of chunk i, then waits for chunk i - 1 and runs its
// matmul, on the slice of chunk i - 1 (the view is made again for i - 1); after the
// loop the last chunk's wait and matmul. All of it only if there is a chunk at all.

!a = !fusion.tensor<[?, 2, ?, ?], f32, mesh = [0, 1], axes = [_, didx, _, _]>
!g = !fusion.tensor<[?, 2, ?, ?], f32, mesh = [0, 1], axes = [stream, _, _, _]>
!b = !fusion.tensor<[?, ?], f32, mesh = [0, 1]>

func.func @ag_matmul(%a: !a, %b: !b) -> !g {
  %s = hir.dim %a, 0 : !a
  %m = hir.dim %a, 2 : !a
  %k = hir.dim %a, 3 : !a
  %n = hir.dim %b, 1 : !b
  %shards = hir.allocate(%s, %m, %k) symmetric : !a
  hir.copy ins(%a : !a) outs(%shards : !a)
  %gathered = hir.allocate(%s, %m, %k) : !g
  %work = hir.allgather %shards into %gathered team [0, 1] backend cuda : !a, !g
  hir.wait %work
  %out = hir.allocate(%s, %m, %n) : !g
  hir.matmul ins(%gathered, %b : !g, !b) outs(%out : !g)
  func.return %out : !g
}

// CHECK-LABEL: func.func @ag_matmul(
// CHECK-NOT:     hir.get_current_stream
// CHECK-NOT:     hir.set_current_stream
// CHECK-DAG:     %[[C0:[^ ]+]] = arith.constant 0 : index
// CHECK-DAG:     %[[C1:[^ ]+]] = arith.constant 1 : index
// CHECK:         %[[SHARDS:[^ ]+]] = hir.allocate({{.*}}) symmetric
// CHECK:         %[[G:[^ ]+]] = hir.allocate
// CHECK:         %[[OUT:[^ ]+]] = hir.allocate
// CHECK-NEXT:    %[[NONEMPTY:[^ ]+]] = arith.cmpi ugt, %[[N:[^ ]+]], %[[C0]] : index
// CHECK-NEXT:    scf.if %[[NONEMPTY]] {
// CHECK-NEXT:      %[[SHARDS_0:[^ ]+]] = hir.alias_select %[[SHARDS]][0 = %[[C0]]]
// CHECK-NEXT:      %[[G_0:[^ ]+]] = hir.alias_select %[[G]][0 = %[[C0]]]
// CHECK-NEXT:      %[[W0:[^ ]+]] = hir.allgather %[[SHARDS_0]] into %[[G_0]] team [0, 1] backend cuda
// CHECK-NEXT:      %[[LAST:[^ ]+]] = scf.for %[[I:[^ ]+]] = %[[C1]] to %[[N]] step %[[C1]] iter_args(%[[PREVIOUS:[^ ]+]] = %[[W0]]) -> (!hir.work) {
// CHECK-NEXT:        %[[SHARDS_I:[^ ]+]] = hir.alias_select %[[SHARDS]][0 = %[[I]]]
// CHECK-NEXT:        %[[G_I:[^ ]+]] = hir.alias_select %[[G]][0 = %[[I]]]
// CHECK-NEXT:        %[[W:[^ ]+]] = hir.allgather %[[SHARDS_I]] into %[[G_I]] team [0, 1] backend cuda
// CHECK-NEXT:        %[[BEFORE:[^ ]+]] = arith.subi %[[I]], %[[C1]] : index
// CHECK-NEXT:        %[[G_BEFORE:[^ ]+]] = hir.alias_select %[[G]][0 = %[[BEFORE]]]
// CHECK-NEXT:        hir.wait %[[PREVIOUS]]
// CHECK-NEXT:        %[[OUT_BEFORE:[^ ]+]] = hir.alias_select %[[OUT]][0 = %[[BEFORE]]]
// CHECK-NEXT:        hir.matmul ins(%[[G_BEFORE]], %{{.*}} : {{.*}}) outs(%[[OUT_BEFORE]] :
// CHECK-NEXT:        scf.yield %[[W]] : !hir.work
// CHECK-NEXT:      }
// CHECK-NEXT:      %[[LAST_I:[^ ]+]] = arith.subi %[[N]], %[[C1]] : index
// CHECK-NEXT:      %[[G_LAST:[^ ]+]] = hir.alias_select %[[G]][0 = %[[LAST_I]]]
// CHECK-NEXT:      hir.wait %[[LAST]]
// CHECK-NEXT:      %[[OUT_LAST:[^ ]+]] = hir.alias_select %[[OUT]][0 = %[[LAST_I]]]
// CHECK-NEXT:      hir.matmul ins(%[[G_LAST]], %{{.*}} : {{.*}}) outs(%[[OUT_LAST]] :
// CHECK-NEXT:    } else {
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %[[OUT]]

// By default the gathered buffer, which only the loop slices, gets two slices: the
// allgather of chunk i fills slice i mod 2, which the matmul of chunk i - 2 has read
// before on the same stream. The returned output keeps one slice per chunk.

// SHARED-LABEL: func.func @ag_matmul(
// SHARED-DAG:     %[[C2:[^ ]+]] = arith.constant 2 : index
// SHARED:         %[[S:[^ ]+]] = hir.dim %{{.*}}, 0
// SHARED:         %[[SLOTS:[^ ]+]] = arith.minui %[[S]], %[[C2]] : index
// SHARED-NEXT:    %[[G:[^ ]+]] = hir.allocate(%[[SLOTS]], %{{.*}}, %{{.*}}) : !fusion.tensor<[?, 2, ?, ?], f32, mesh = [0, 1], axes = [stream, _, _, _]>
// SHARED-NEXT:    %[[OUT:[^ ]+]] = hir.allocate(%[[S]],
// SHARED:         scf.for %[[I:[^ ]+]] =
// SHARED:           %[[SLOT:[^ ]+]] = arith.remui %[[I]], %[[C2]] : index
// SHARED-NEXT:      %[[G_I:[^ ]+]] = hir.alias_select %[[G]][0 = %[[SLOT]]]
// SHARED-NEXT:      hir.allgather %{{.*}} into %[[G_I]]
// SHARED-NEXT:      %[[BEFORE:[^ ]+]] = arith.subi %[[I]]
// SHARED-NEXT:      %[[SLOT_BEFORE:[^ ]+]] = arith.remui %[[BEFORE]], %[[C2]] : index
// SHARED-NEXT:      %[[G_BEFORE:[^ ]+]] = hir.alias_select %[[G]][0 = %[[SLOT_BEFORE]]]
// SHARED-NEXT:      hir.wait
// SHARED-NEXT:      %[[OUT_BEFORE:[^ ]+]] = hir.alias_select %[[OUT]][0 = %[[BEFORE]]]
// SHARED-NEXT:      hir.matmul ins(%[[G_BEFORE]],

// POOL-LABEL: func.func @ag_matmul(
// POOL-NOT:     iter_args
// POOL:         scf.for
// POOL:           hir.set_current_stream %stream
// POOL:           hir.alias_select %{{.*}}[0 = %stream_index
// POOL-NEXT:      hir.allgather
// POOL:         func.return

// -----

// The same on NCCL: its kernels need the SMs, and the pool streams let them run beside
// the matmuls of other chunks. The stream loops stay.

!a = !fusion.tensor<[?, 2, ?, ?], f32, mesh = [0, 1], axes = [_, didx, _, _]>
!g = !fusion.tensor<[?, 2, ?, ?], f32, mesh = [0, 1], axes = [stream, _, _, _]>
!b = !fusion.tensor<[?, ?], f32, mesh = [0, 1]>

func.func @ag_matmul_nccl(%a: !a, %b: !b) -> !g {
  %s = hir.dim %a, 0 : !a
  %m = hir.dim %a, 2 : !a
  %k = hir.dim %a, 3 : !a
  %n = hir.dim %b, 1 : !b
  %gathered = hir.allocate(%s, %m, %k) : !g
  %work = hir.allgather %a into %gathered team [0, 1] backend nccl : !a, !g
  hir.wait %work
  %out = hir.allocate(%s, %m, %n) : !g
  hir.matmul ins(%gathered, %b : !g, !b) outs(%out : !g)
  func.return %out : !g
}

// CHECK-LABEL: func.func @ag_matmul_nccl(
// CHECK:         hir.get_current_stream
// CHECK-NOT:     scf.if
// CHECK:         scf.for
// CHECK:           hir.synchronize_stream
// CHECK:         scf.for
// CHECK:           hir.allgather {{.*}} backend nccl
// CHECK-NEXT:      hir.wait
// CHECK:           hir.matmul
// CHECK-NEXT:      hir.set_current_stream
// CHECK-NEXT:      hir.synchronize_stream

// -----

// A loop whose work after the wait reads more of the iteration than its views (here
// the buffer the iteration allocates) is left to its streams: that value cannot be
// made again for the iteration before.

!t = !fusion.tensor<[?, 2, 4], f32, mesh = [0, 1], axes = [_, didx, _]>
!o = !fusion.tensor<[?, 2, 4], f32, mesh = [0, 1], axes = [stream, _, _]>
!s = !fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>
!r = !fusion.tensor<[2, 4], f32, mesh = [0, 1]>

func.func @reads_an_allocation(%x: !t) -> !o {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %main = hir.get_current_stream
  %n = hir.dim %x, 0 : !t
  %shards = hir.allocate(%n) symmetric : !t
  hir.copy ins(%x : !t) outs(%shards : !t)
  %out = hir.allocate(%n) : !o
  %ns = hir.number_of_streams
  scf.for %i = %c0 to %n step %c1 {
    %si = arith.remui %i, %ns : index
    %stream = hir.stream %si
    hir.set_current_stream %stream
    hir.synchronize_stream %main
    %shard = hir.alias_select %shards[0 = %i] : !t -> !s
    %gathered = hir.allocate() : !r
    %w = hir.allgather %shard into %gathered team [0, 1] backend cuda : !s, !r
    hir.wait %w
    %out_i = hir.alias_select %out[0 = %i] : !o -> !r
    hir.copy ins(%gathered : !r) outs(%out_i : !r)
    hir.set_current_stream %main
    hir.synchronize_stream %stream
  }
  func.return %out : !o
}

// CHECK-LABEL: func.func @reads_an_allocation(
// CHECK-NOT:     scf.if
// CHECK:         scf.for
// CHECK:           hir.set_current_stream
// CHECK:           hir.allgather {{.*}} backend cuda
// CHECK-NEXT:      hir.wait

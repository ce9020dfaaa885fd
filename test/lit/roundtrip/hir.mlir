// Round trip of the hir dialect: !hir.stream, !hir.work, the backend attribute and
// every op. Each is checked in the custom form and in the generic form
// (--print-op-generic), and both forms are fixed points of hir-opt, the generic one
// also when printed back in the custom form.
// RUN: hir-opt %s | filecheck %s
// RUN: hir-opt %s | hir-opt | filecheck %s
// RUN: hir-opt --print-op-generic %s | hir-opt | filecheck %s
// RUN: hir-opt --print-op-generic %s | filecheck %s --check-prefix=GENERIC
// RUN: hir-opt --print-op-generic %s | hir-opt --print-op-generic | filecheck %s --check-prefix=GENERIC

// ====================================================================================
// Types and attributes (with fusion's mesh and parallel-type attributes)
// ====================================================================================

// CHECK-LABEL: func.func @attributes(%stream: !hir.stream, %work: !hir.work)
// CHECK-SAME: attributes {mesh = #fusion.mesh<[0, 2, 1]>, single = #fusion.mesh<[0]>,
// CHECK-SAME: serial = #fusion<parallel_type serial>, didx = #fusion<parallel_type didx>, stream = #fusion<parallel_type stream>,
// CHECK-SAME: nccl = #hir<backend nccl>, cuda = #hir<backend cuda>} {
// GENERIC-LABEL: "func.func"() <{sym_name = "attributes", function_type = (!hir.stream, !hir.work) -> ()}> ({
// GENERIC-NEXT: ^bb0(%stream: !hir.stream, %work: !hir.work):
// GENERIC-NEXT: "func.return"() : () -> ()
// GENERIC-NEXT: }) {mesh = #fusion.mesh<[0, 2, 1]>, single = #fusion.mesh<[0]>,
// GENERIC-SAME: serial = #fusion<parallel_type serial>, didx = #fusion<parallel_type didx>, stream = #fusion<parallel_type stream>,
// GENERIC-SAME: nccl = #hir<backend nccl>, cuda = #hir<backend cuda>} : () -> ()
func.func @attributes(%stream: !hir.stream, %work: !hir.work) attributes {
    mesh = #fusion.mesh<[0, 2, 1]>, single = #fusion.mesh<[0]>,
    serial = #fusion<parallel_type serial>, didx = #fusion<parallel_type didx>,
    stream = #fusion<parallel_type stream>,
    nccl = #hir<backend nccl>, cuda = #hir<backend cuda>} {
  func.return
}

// ====================================================================================
// Buffers, runtime scalars and streams
// ====================================================================================

// CHECK-LABEL: func.func @buffers(
// CHECK-NEXT: %rows = hir.dim %in, 0 : !fusion.tensor<[?, 2, ?], f32, mesh = [0, 1], axes = [_, didx, _]>
// CHECK-NEXT: %shards = hir.dim %in, 1 {tag} : !fusion.tensor<[?, 2, ?], f32, mesh = [0, 1], axes = [_, didx, _]>
// CHECK-NEXT: %cols = hir.dim %in, 2 : !fusion.tensor<[?, 2, ?], f32, mesh = [0, 1], axes = [_, didx, _]>
// CHECK-NEXT: %dynamic = hir.allocate(%rows, %cols) : !fusion.tensor<[?, 2, ?], f32, mesh = [0, 1]>
// CHECK-NEXT: %static = hir.allocate() {tag} : !fusion.tensor<[4, 2], i64, mesh = [0, 1], axes = [_, didx]>
// CHECK-NEXT: %peers_read = hir.allocate(%rows, %cols) symmetric : !fusion.tensor<[?, 2, ?], f32, mesh = [0, 1], axes = [_, didx, _]>
// CHECK-NEXT: %tagged = hir.allocate() symmetric {tag} : !fusion.tensor<[4, 2], i64, mesh = [0, 1], axes = [_, didx]>
// CHECK-NEXT: %ordered = hir.allocate(%rows, %cols) order [2, 0, 1] : !fusion.tensor<[?, 2, ?], f32, mesh = [0, 1], axes = [stream, _, _]>
// CHECK-NEXT: %row = hir.alias_select %in[0 = %shards] : !fusion.tensor<[?, 2, ?], f32, mesh = [0, 1], axes = [_, didx, _]> -> !fusion.tensor<[2, ?], f32, mesh = [0, 1], axes = [didx, _]>
// CHECK-NEXT: %shard = hir.alias_select %row[0 = %shards] {tag} : !fusion.tensor<[2, ?], f32, mesh = [0, 1], axes = [didx, _]> -> !fusion.tensor<[?], f32, mesh = [0, 1]>
// CHECK-NEXT: hir.deallocate %dynamic : !fusion.tensor<[?, 2, ?], f32, mesh = [0, 1]>
// CHECK-NEXT: hir.deallocate %static {tag} : !fusion.tensor<[4, 2], i64, mesh = [0, 1], axes = [_, didx]>
// GENERIC-LABEL: sym_name = "buffers"
// GENERIC: %rows = "hir.dim"(%in) <{axis = #builtin.int<0>}> : (!fusion.tensor<[?, 2, ?], f32, mesh = [0, 1], axes = [_, didx, _]>) -> index
// GENERIC-NEXT: %shards = "hir.dim"(%in) <{axis = #builtin.int<1>}> {tag} : (!fusion.tensor<[?, 2, ?], f32, mesh = [0, 1], axes = [_, didx, _]>) -> index
// GENERIC-NEXT: %cols = "hir.dim"(%in) <{axis = #builtin.int<2>}> : (!fusion.tensor<[?, 2, ?], f32, mesh = [0, 1], axes = [_, didx, _]>) -> index
// GENERIC-NEXT: %dynamic = "hir.allocate"(%rows, %cols) : (index, index) -> !fusion.tensor<[?, 2, ?], f32, mesh = [0, 1]>
// GENERIC-NEXT: %static = "hir.allocate"() {tag} : () -> !fusion.tensor<[4, 2], i64, mesh = [0, 1], axes = [_, didx]>
// GENERIC-NEXT: %peers_read = "hir.allocate"(%rows, %cols) <{symmetric}> : (index, index) -> !fusion.tensor<[?, 2, ?], f32, mesh = [0, 1], axes = [_, didx, _]>
// GENERIC-NEXT: %tagged = "hir.allocate"() <{symmetric}> {tag} : () -> !fusion.tensor<[4, 2], i64, mesh = [0, 1], axes = [_, didx]>
// GENERIC-NEXT: %ordered = "hir.allocate"(%rows, %cols) <{order = array<i64: 2, 0, 1>}> : (index, index) -> !fusion.tensor<[?, 2, ?], f32, mesh = [0, 1], axes = [stream, _, _]>
// GENERIC-NEXT: %row = "hir.alias_select"(%in, %shards) <{axis = #builtin.int<0>}> : (!fusion.tensor<[?, 2, ?], f32, mesh = [0, 1], axes = [_, didx, _]>, index) -> !fusion.tensor<[2, ?], f32, mesh = [0, 1], axes = [didx, _]>
// GENERIC-NEXT: %shard = "hir.alias_select"(%row, %shards) <{axis = #builtin.int<0>}> {tag} : (!fusion.tensor<[2, ?], f32, mesh = [0, 1], axes = [didx, _]>, index) -> !fusion.tensor<[?], f32, mesh = [0, 1]>
// GENERIC-NEXT: "hir.deallocate"(%dynamic) : (!fusion.tensor<[?, 2, ?], f32, mesh = [0, 1]>) -> ()
// GENERIC-NEXT: "hir.deallocate"(%static) {tag} : (!fusion.tensor<[4, 2], i64, mesh = [0, 1], axes = [_, didx]>) -> ()
func.func @buffers(%in: !fusion.tensor<[?, 2, ?], f32, mesh = [0, 1], axes = [_, didx, _]>) {
  %rows = hir.dim %in, 0 : !fusion.tensor<[?, 2, ?], f32, mesh = [0, 1], axes = [_, didx, _]>
  %shards = hir.dim %in, 1 {tag} : !fusion.tensor<[?, 2, ?], f32, mesh = [0, 1], axes = [_, didx, _]>
  %cols = hir.dim %in, 2 : !fusion.tensor<[?, 2, ?], f32, mesh = [0, 1], axes = [_, didx, _]>
  %dynamic = hir.allocate(%rows, %cols) : !fusion.tensor<[?, 2, ?], f32, mesh = [0, 1]>
  %static = hir.allocate() {tag} : !fusion.tensor<[4, 2], i64, mesh = [0, 1], axes = [_, didx]>
  %peers_read = hir.allocate(%rows, %cols) symmetric : !fusion.tensor<[?, 2, ?], f32, mesh = [0, 1], axes = [_, didx, _]>
  %tagged = hir.allocate() symmetric {tag} : !fusion.tensor<[4, 2], i64, mesh = [0, 1], axes = [_, didx]>
  %ordered = hir.allocate(%rows, %cols) order [2, 0, 1] : !fusion.tensor<[?, 2, ?], f32, mesh = [0, 1], axes = [stream, _, _]>
  %row = hir.alias_select %in[0 = %shards] : !fusion.tensor<[?, 2, ?], f32, mesh = [0, 1], axes = [_, didx, _]> -> !fusion.tensor<[2, ?], f32, mesh = [0, 1], axes = [didx, _]>
  %shard = hir.alias_select %row[0 = %shards] {tag} : !fusion.tensor<[2, ?], f32, mesh = [0, 1], axes = [didx, _]> -> !fusion.tensor<[?], f32, mesh = [0, 1]>
  hir.deallocate %dynamic : !fusion.tensor<[?, 2, ?], f32, mesh = [0, 1]>
  hir.deallocate %static {tag} : !fusion.tensor<[4, 2], i64, mesh = [0, 1], axes = [_, didx]>
  func.return
}

// CHECK-LABEL: func.func @streams(%n: index) {
// CHECK-NEXT: %c0 = arith.constant 0 : index
// CHECK-NEXT: %c1 = arith.constant 1 : index
// CHECK-NEXT: %rank = hir.device_index
// CHECK-NEXT: %count = hir.number_of_streams {tag}
// CHECK-NEXT: %main = hir.get_current_stream
// CHECK-NEXT: scf.for %i = %c0 to %n step %c1 {
// CHECK-NEXT: %j = arith.remui %i, %count : index
// CHECK-NEXT: %s = hir.stream %j
// CHECK-NEXT: hir.set_current_stream %s
// CHECK-NEXT: hir.synchronize_stream %main
// CHECK-NEXT: hir.set_current_stream %main {tag}
// CHECK-NEXT: hir.synchronize_stream %s {tag}
// CHECK-NEXT: }
// CHECK-NEXT: %pool = hir.stream %rank {tag}
// CHECK-NEXT: %other = hir.get_current_stream {tag}
// GENERIC-LABEL: sym_name = "streams"
// GENERIC: %rank = "hir.device_index"() : () -> index
// GENERIC-NEXT: %count = "hir.number_of_streams"() {tag} : () -> index
// GENERIC-NEXT: %main = "hir.get_current_stream"() : () -> !hir.stream
// GENERIC-NEXT: "scf.for"(%c0, %n, %c1) ({
// GENERIC-NEXT: ^bb0(%i: index):
// GENERIC-NEXT: %j = "arith.remui"(%i, %count) : (index, index) -> index
// GENERIC-NEXT: %s = "hir.stream"(%j) : (index) -> !hir.stream
// GENERIC-NEXT: "hir.set_current_stream"(%s) : (!hir.stream) -> ()
// GENERIC-NEXT: "hir.synchronize_stream"(%main) : (!hir.stream) -> ()
// GENERIC-NEXT: "hir.set_current_stream"(%main) {tag} : (!hir.stream) -> ()
// GENERIC-NEXT: "hir.synchronize_stream"(%s) {tag} : (!hir.stream) -> ()
// GENERIC-NEXT: "scf.yield"() : () -> ()
// GENERIC-NEXT: }) : (index, index, index) -> ()
// GENERIC-NEXT: %pool = "hir.stream"(%rank) {tag} : (index) -> !hir.stream
// GENERIC-NEXT: %other = "hir.get_current_stream"() {tag} : () -> !hir.stream
func.func @streams(%n: index) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %rank = hir.device_index
  %count = hir.number_of_streams {tag}
  %main = hir.get_current_stream
  scf.for %i = %c0 to %n step %c1 {
    %j = arith.remui %i, %count : index
    %s = hir.stream %j
    hir.set_current_stream %s
    hir.synchronize_stream %main
    hir.set_current_stream %main {tag}
    hir.synchronize_stream %s {tag}
  }
  %pool = hir.stream %rank {tag}
  %other = hir.get_current_stream {tag}
  func.return
}

// ====================================================================================
// Communication
// ====================================================================================

// CHECK-LABEL: func.func @collectives(
// CHECK-NEXT: %w0 = hir.allgather %sharded into %full team [0, 1] backend cuda : !fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>, !fusion.tensor<[2, 4], f32, mesh = [0, 1]>
// CHECK-NEXT: %w1 = hir.allreduce %sharded into %row team [0, 1] op sum backend nccl : !fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>, !fusion.tensor<[4], f32, mesh = [0, 1]>
// CHECK-NEXT: %w2 = hir.reduce_scatter %full into %sharded team [0, 1] op max backend nccl : !fusion.tensor<[2, 4], f32, mesh = [0, 1]>, !fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>
// CHECK-NEXT: %w3 = hir.broadcast %full into %full team [0, 1] root 1 backend nccl : !fusion.tensor<[2, 4], f32, mesh = [0, 1]>, !fusion.tensor<[2, 4], f32, mesh = [0, 1]>
// CHECK-NEXT: %w4 = hir.reduce %sharded into %row team [0, 1] root 0 op min backend nccl : !fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>, !fusion.tensor<[4], f32, mesh = [0, 1]>
// CHECK-NEXT: %w5 = hir.gather %sharded into %full team [1, 0] root 0 backend nccl : !fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>, !fusion.tensor<[2, 4], f32, mesh = [0, 1]>
// CHECK-NEXT: %w6 = hir.scatter %full into %sharded team [0, 1] root 1 backend nccl : !fusion.tensor<[2, 4], f32, mesh = [0, 1]>, !fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>
// CHECK-NEXT: %w7 = hir.send_recv %pair into %pair team [2, 3] root 2 backend nccl : !fusion.tensor<[4], f32, mesh = [0, 1, 2, 3]>, !fusion.tensor<[4], f32, mesh = [0, 1, 2, 3]>
// CHECK-NEXT: %w8 = hir.allreduce %sharded into %row team [0, 1] op product backend nccl {tag} : !fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>, !fusion.tensor<[4], f32, mesh = [0, 1]>
// GENERIC-LABEL: sym_name = "collectives"
// GENERIC: %w0 = "hir.allgather"(%sharded, %full) <{team = #fusion.mesh<[0, 1]>, backend = #hir<backend cuda>}> : (!fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>, !fusion.tensor<[2, 4], f32, mesh = [0, 1]>) -> !hir.work
// GENERIC-NEXT: %w1 = "hir.allreduce"(%sharded, %row) <{team = #fusion.mesh<[0, 1]>, reduce_op = #shard<partial sum>, backend = #hir<backend nccl>}> : (!fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>, !fusion.tensor<[4], f32, mesh = [0, 1]>) -> !hir.work
// GENERIC-NEXT: %w2 = "hir.reduce_scatter"(%full, %sharded) <{team = #fusion.mesh<[0, 1]>, reduce_op = #shard<partial max>, backend = #hir<backend nccl>}> : (!fusion.tensor<[2, 4], f32, mesh = [0, 1]>, !fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>) -> !hir.work
// GENERIC-NEXT: %w3 = "hir.broadcast"(%full, %full) <{team = #fusion.mesh<[0, 1]>, root = #builtin.int<1>, backend = #hir<backend nccl>}> : (!fusion.tensor<[2, 4], f32, mesh = [0, 1]>, !fusion.tensor<[2, 4], f32, mesh = [0, 1]>) -> !hir.work
// GENERIC-NEXT: %w4 = "hir.reduce"(%sharded, %row) <{team = #fusion.mesh<[0, 1]>, root = #builtin.int<0>, reduce_op = #shard<partial min>, backend = #hir<backend nccl>}> : (!fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>, !fusion.tensor<[4], f32, mesh = [0, 1]>) -> !hir.work
// GENERIC-NEXT: %w5 = "hir.gather"(%sharded, %full) <{team = #fusion.mesh<[1, 0]>, root = #builtin.int<0>, backend = #hir<backend nccl>}> : (!fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>, !fusion.tensor<[2, 4], f32, mesh = [0, 1]>) -> !hir.work
// GENERIC-NEXT: %w6 = "hir.scatter"(%full, %sharded) <{team = #fusion.mesh<[0, 1]>, root = #builtin.int<1>, backend = #hir<backend nccl>}> : (!fusion.tensor<[2, 4], f32, mesh = [0, 1]>, !fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>) -> !hir.work
// GENERIC-NEXT: %w7 = "hir.send_recv"(%pair, %pair) <{team = #fusion.mesh<[2, 3]>, root = #builtin.int<2>, backend = #hir<backend nccl>}> : (!fusion.tensor<[4], f32, mesh = [0, 1, 2, 3]>, !fusion.tensor<[4], f32, mesh = [0, 1, 2, 3]>) -> !hir.work
// GENERIC-NEXT: %w8 = "hir.allreduce"(%sharded, %row) <{team = #fusion.mesh<[0, 1]>, reduce_op = #shard<partial product>, backend = #hir<backend nccl>}> {tag} : (!fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>, !fusion.tensor<[4], f32, mesh = [0, 1]>) -> !hir.work
func.func @collectives(%sharded: !fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>,
                       %full: !fusion.tensor<[2, 4], f32, mesh = [0, 1]>,
                       %row: !fusion.tensor<[4], f32, mesh = [0, 1]>,
                       %pair: !fusion.tensor<[4], f32, mesh = [0, 1, 2, 3]>) {
  %w0 = hir.allgather %sharded into %full team [0, 1] backend cuda : !fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>, !fusion.tensor<[2, 4], f32, mesh = [0, 1]>
  %w1 = hir.allreduce %sharded into %row team [0, 1] op sum backend nccl : !fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>, !fusion.tensor<[4], f32, mesh = [0, 1]>
  %w2 = hir.reduce_scatter %full into %sharded team [0, 1] op max backend nccl : !fusion.tensor<[2, 4], f32, mesh = [0, 1]>, !fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>
  %w3 = hir.broadcast %full into %full team [0, 1] root 1 backend nccl : !fusion.tensor<[2, 4], f32, mesh = [0, 1]>, !fusion.tensor<[2, 4], f32, mesh = [0, 1]>
  %w4 = hir.reduce %sharded into %row team [0, 1] root 0 op min backend nccl : !fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>, !fusion.tensor<[4], f32, mesh = [0, 1]>
  %w5 = hir.gather %sharded into %full team [1, 0] root 0 backend nccl : !fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>, !fusion.tensor<[2, 4], f32, mesh = [0, 1]>
  %w6 = hir.scatter %full into %sharded team [0, 1] root 1 backend nccl : !fusion.tensor<[2, 4], f32, mesh = [0, 1]>, !fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>
  %w7 = hir.send_recv %pair into %pair team [2, 3] root 2 backend nccl : !fusion.tensor<[4], f32, mesh = [0, 1, 2, 3]>, !fusion.tensor<[4], f32, mesh = [0, 1, 2, 3]>
  %w8 = hir.allreduce %sharded into %row team [0, 1] op product backend nccl {tag} : !fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>, !fusion.tensor<[4], f32, mesh = [0, 1]>
  func.return
}

// The reductions with a copy-engine form (backend cuda): each member pulls its peers' partials.
// CHECK-LABEL: func.func @copy_engine_reductions(
// CHECK-NEXT: %w0 = hir.allreduce %partial into %row team [0, 1] op sum backend cuda : !fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>, !fusion.tensor<[4], f32, mesh = [0, 1]>
// CHECK-NEXT: %w1 = hir.reduce_scatter %partials into %shard team [1, 0] op max backend cuda {tag} : !fusion.tensor<[2, 2, 4], bf16, mesh = [0, 1], axes = [didx, _, _]>, !fusion.tensor<[2, 4], bf16, mesh = [0, 1], axes = [didx, _]>
// GENERIC-LABEL: sym_name = "copy_engine_reductions"
// GENERIC: %w0 = "hir.allreduce"(%partial, %row) <{team = #fusion.mesh<[0, 1]>, reduce_op = #shard<partial sum>, backend = #hir<backend cuda>}> : (!fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>, !fusion.tensor<[4], f32, mesh = [0, 1]>) -> !hir.work
// GENERIC-NEXT: %w1 = "hir.reduce_scatter"(%partials, %shard) <{team = #fusion.mesh<[1, 0]>, reduce_op = #shard<partial max>, backend = #hir<backend cuda>}> {tag} : (!fusion.tensor<[2, 2, 4], bf16, mesh = [0, 1], axes = [didx, _, _]>, !fusion.tensor<[2, 4], bf16, mesh = [0, 1], axes = [didx, _]>) -> !hir.work
func.func @copy_engine_reductions(%partial: !fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>,
                                  %row: !fusion.tensor<[4], f32, mesh = [0, 1]>,
                                  %partials: !fusion.tensor<[2, 2, 4], bf16, mesh = [0, 1], axes = [didx, _, _]>,
                                  %shard: !fusion.tensor<[2, 4], bf16, mesh = [0, 1], axes = [didx, _]>) {
  %w0 = hir.allreduce %partial into %row team [0, 1] op sum backend cuda : !fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>, !fusion.tensor<[4], f32, mesh = [0, 1]>
  %w1 = hir.reduce_scatter %partials into %shard team [1, 0] op max backend cuda {tag} : !fusion.tensor<[2, 2, 4], bf16, mesh = [0, 1], axes = [didx, _, _]>, !fusion.tensor<[2, 4], bf16, mesh = [0, 1], axes = [didx, _]>
  func.return
}

// The point-to-point allgather step: a coalesced recv+send with a peer, then a wait.
// CHECK-LABEL: func.func @point_to_point(
// CHECK-NEXT: hir.start_coalescing
// CHECK-NEXT: %received = hir.recv %slot from %peer backend nccl : !fusion.tensor<[4], f32, mesh = [0, 1]>
// CHECK-NEXT: %sent = hir.send %mine to %peer backend cuda {tag} : !fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>
// CHECK-NEXT: %batch = hir.end_coalescing
// CHECK-NEXT: hir.wait %batch
// CHECK-NEXT: hir.start_coalescing {tag}
// CHECK-NEXT: %empty = hir.end_coalescing {tag}
// CHECK-NEXT: hir.wait %received {tag}
// GENERIC-LABEL: sym_name = "point_to_point"
// GENERIC: "hir.start_coalescing"() : () -> ()
// GENERIC-NEXT: %received = "hir.recv"(%slot, %peer) <{backend = #hir<backend nccl>}> : (!fusion.tensor<[4], f32, mesh = [0, 1]>, index) -> !hir.work
// GENERIC-NEXT: %sent = "hir.send"(%mine, %peer) <{backend = #hir<backend cuda>}> {tag} : (!fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>, index) -> !hir.work
// GENERIC-NEXT: %batch = "hir.end_coalescing"() : () -> !hir.work
// GENERIC-NEXT: "hir.wait"(%batch) : (!hir.work) -> ()
// GENERIC-NEXT: "hir.start_coalescing"() {tag} : () -> ()
// GENERIC-NEXT: %empty = "hir.end_coalescing"() {tag} : () -> !hir.work
// GENERIC-NEXT: "hir.wait"(%received) {tag} : (!hir.work) -> ()
func.func @point_to_point(%slot: !fusion.tensor<[4], f32, mesh = [0, 1]>,
                          %mine: !fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>,
                          %peer: index) {
  hir.start_coalescing
  %received = hir.recv %slot from %peer backend nccl : !fusion.tensor<[4], f32, mesh = [0, 1]>
  %sent = hir.send %mine to %peer backend cuda {tag} : !fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>
  %batch = hir.end_coalescing
  hir.wait %batch
  hir.start_coalescing {tag}
  %empty = hir.end_coalescing {tag}
  hir.wait %received {tag}
  func.return
}

// ====================================================================================
// Compute and segment calls
// ====================================================================================

// CHECK-LABEL: func.func private @segment(
// CHECK-NEXT: %sum = fusion.add %x, %y : (!fusion.tensor<[?, 4], f32>, !fusion.tensor<[4], f32>) -> !fusion.tensor<[?, 4], f32>
// CHECK-NEXT: %neg = fusion.neg %sum : !fusion.tensor<[?, 4], f32> -> !fusion.tensor<[?, 4], f32>
// CHECK-NEXT: func.return %sum, %neg : !fusion.tensor<[?, 4], f32>, !fusion.tensor<[?, 4], f32>
// GENERIC-LABEL: "func.func"() <{sym_name = "segment", function_type = (!fusion.tensor<[?, 4], f32>, !fusion.tensor<[4], f32>) -> (!fusion.tensor<[?, 4], f32>, !fusion.tensor<[?, 4], f32>), sym_visibility = "private"}> ({
func.func private @segment(%x: !fusion.tensor<[?, 4], f32>, %y: !fusion.tensor<[4], f32>) -> (!fusion.tensor<[?, 4], f32>, !fusion.tensor<[?, 4], f32>) {
  %sum = fusion.add %x, %y : (!fusion.tensor<[?, 4], f32>, !fusion.tensor<[4], f32>) -> !fusion.tensor<[?, 4], f32>
  %neg = fusion.neg %sum : !fusion.tensor<[?, 4], f32> -> !fusion.tensor<[?, 4], f32>
  func.return %sum, %neg : !fusion.tensor<[?, 4], f32>, !fusion.tensor<[?, 4], f32>
}

// CHECK-LABEL: func.func private @constant_segment() -> !fusion.tensor<[], f32> {
func.func private @constant_segment() -> !fusion.tensor<[], f32> {
  %one = fusion.constant 1.0 : f32 : !fusion.tensor<[], f32>
  func.return %one : !fusion.tensor<[], f32>
}

// CHECK-LABEL: func.func @segments(
// CHECK-NEXT: hir.launch_kernel @segment ins(%a, %v : !fusion.tensor<[?, 4], f32>, !fusion.tensor<[4], f32>) outs(%b, %c : !fusion.tensor<[?, 4], f32>, !fusion.tensor<[?, 4], f32>)
// CHECK-NEXT: hir.post_on_stream @segment ins(%a, %v : !fusion.tensor<[?, 4], f32>, !fusion.tensor<[4], f32>) outs(%b, %c : !fusion.tensor<[?, 4], f32>, !fusion.tensor<[?, 4], f32>) {tag}
// CHECK-NEXT: hir.launch_kernel @constant_segment ins() outs(%s : !fusion.tensor<[], f32>)
// GENERIC-LABEL: sym_name = "segments"
// GENERIC: "hir.launch_kernel"(%a, %v, %b, %c) <{callee = @segment, operandSegmentSizes = array<i32: 2, 2>}> : (!fusion.tensor<[?, 4], f32>, !fusion.tensor<[4], f32>, !fusion.tensor<[?, 4], f32>, !fusion.tensor<[?, 4], f32>) -> ()
// GENERIC-NEXT: "hir.post_on_stream"(%a, %v, %b, %c) <{callee = @segment, operandSegmentSizes = array<i32: 2, 2>}> {tag} : (!fusion.tensor<[?, 4], f32>, !fusion.tensor<[4], f32>, !fusion.tensor<[?, 4], f32>, !fusion.tensor<[?, 4], f32>) -> ()
// GENERIC-NEXT: "hir.launch_kernel"(%s) <{callee = @constant_segment, operandSegmentSizes = array<i32: 0, 1>}> : (!fusion.tensor<[], f32>) -> ()
func.func @segments(%a: !fusion.tensor<[?, 4], f32>, %v: !fusion.tensor<[4], f32>,
                    %b: !fusion.tensor<[?, 4], f32>, %c: !fusion.tensor<[?, 4], f32>,
                    %s: !fusion.tensor<[], f32>) {
  hir.launch_kernel @segment ins(%a, %v : !fusion.tensor<[?, 4], f32>, !fusion.tensor<[4], f32>) outs(%b, %c : !fusion.tensor<[?, 4], f32>, !fusion.tensor<[?, 4], f32>)
  hir.post_on_stream @segment ins(%a, %v : !fusion.tensor<[?, 4], f32>, !fusion.tensor<[4], f32>) outs(%b, %c : !fusion.tensor<[?, 4], f32>, !fusion.tensor<[?, 4], f32>) {tag}
  hir.launch_kernel @constant_segment ins() outs(%s : !fusion.tensor<[], f32>)
  func.return
}

// CHECK-LABEL: func.func @eager(
// CHECK-NEXT: hir.matmul ins(%x, %w : !fusion.tensor<[?, 8], bf16>, !fusion.tensor<[8, 16], bf16>) outs(%y : !fusion.tensor<[?, 16], bf16>)
// CHECK-NEXT: hir.matmul accumulate ins(%x, %w : !fusion.tensor<[?, 8], bf16>, !fusion.tensor<[8, 16], bf16>) outs(%y : !fusion.tensor<[?, 16], bf16>) {tag}
// CHECK-NEXT: hir.linear ins(%x, %wt : !fusion.tensor<[?, 8], bf16>, !fusion.tensor<[16, 8], bf16>) outs(%y : !fusion.tensor<[?, 16], bf16>)
// CHECK-NEXT: hir.linear ins(%x, %wt, %bias : !fusion.tensor<[?, 8], bf16>, !fusion.tensor<[16, 8], bf16>, !fusion.tensor<[16], bf16>) outs(%y : !fusion.tensor<[?, 16], bf16>) {tag}
// CHECK-NEXT: hir.copy ins(%y : !fusion.tensor<[?, 16], bf16>) outs(%z : !fusion.tensor<[?, 16], bf16, mesh = [0, 1]>)
// CHECK-NEXT: hir.pointwise "relu" ins(%y : !fusion.tensor<[?, 16], bf16>) outs(%y : !fusion.tensor<[?, 16], bf16>)
// CHECK-NEXT: hir.pointwise "add" ins(%y, %bias : !fusion.tensor<[?, 16], bf16>, !fusion.tensor<[16], bf16>) outs(%y : !fusion.tensor<[?, 16], bf16>)
// CHECK-NEXT: hir.pointwise "cast" ins(%y : !fusion.tensor<[?, 16], bf16>) outs(%f : !fusion.tensor<[?, 16], f32>) {tag}
// CHECK-NEXT: hir.reduction "sum" [1] ins(%y : !fusion.tensor<[?, 16], bf16>) outs(%r : !fusion.tensor<[?], bf16>)
// CHECK-NEXT: hir.reduction "max" [-1] keepdim ins(%y : !fusion.tensor<[?, 16], bf16>) outs(%k : !fusion.tensor<[?, 1], bf16>) {tag}
// GENERIC-LABEL: sym_name = "eager"
// GENERIC: "hir.matmul"(%x, %w, %y) <{operandSegmentSizes = array<i32: 2, 1>}> : (!fusion.tensor<[?, 8], bf16>, !fusion.tensor<[8, 16], bf16>, !fusion.tensor<[?, 16], bf16>) -> ()
// GENERIC-NEXT: "hir.matmul"(%x, %w, %y) <{accumulate, operandSegmentSizes = array<i32: 2, 1>}> {tag} : (!fusion.tensor<[?, 8], bf16>, !fusion.tensor<[8, 16], bf16>, !fusion.tensor<[?, 16], bf16>) -> ()
// GENERIC-NEXT: "hir.linear"(%x, %wt, %y) <{operandSegmentSizes = array<i32: 2, 1>}> : (!fusion.tensor<[?, 8], bf16>, !fusion.tensor<[16, 8], bf16>, !fusion.tensor<[?, 16], bf16>) -> ()
// GENERIC-NEXT: "hir.linear"(%x, %wt, %bias, %y) <{operandSegmentSizes = array<i32: 3, 1>}> {tag} : (!fusion.tensor<[?, 8], bf16>, !fusion.tensor<[16, 8], bf16>, !fusion.tensor<[16], bf16>, !fusion.tensor<[?, 16], bf16>) -> ()
// GENERIC-NEXT: "hir.copy"(%y, %z) <{operandSegmentSizes = array<i32: 1, 1>}> : (!fusion.tensor<[?, 16], bf16>, !fusion.tensor<[?, 16], bf16, mesh = [0, 1]>) -> ()
// GENERIC-NEXT: "hir.pointwise"(%y, %y) <{kind = "relu", operandSegmentSizes = array<i32: 1, 1>}> : (!fusion.tensor<[?, 16], bf16>, !fusion.tensor<[?, 16], bf16>) -> ()
// GENERIC-NEXT: "hir.pointwise"(%y, %bias, %y) <{kind = "add", operandSegmentSizes = array<i32: 2, 1>}> : (!fusion.tensor<[?, 16], bf16>, !fusion.tensor<[16], bf16>, !fusion.tensor<[?, 16], bf16>) -> ()
// GENERIC-NEXT: "hir.pointwise"(%y, %f) <{kind = "cast", operandSegmentSizes = array<i32: 1, 1>}> {tag} : (!fusion.tensor<[?, 16], bf16>, !fusion.tensor<[?, 16], f32>) -> ()
// GENERIC-NEXT: "hir.reduction"(%y, %r) <{kind = "sum", axes = array<i64: 1>, operandSegmentSizes = array<i32: 1, 1>}> : (!fusion.tensor<[?, 16], bf16>, !fusion.tensor<[?], bf16>) -> ()
// GENERIC-NEXT: "hir.reduction"(%y, %k) <{kind = "max", axes = array<i64: -1>, keepdim, operandSegmentSizes = array<i32: 1, 1>}> {tag} : (!fusion.tensor<[?, 16], bf16>, !fusion.tensor<[?, 1], bf16>) -> ()
func.func @eager(%x: !fusion.tensor<[?, 8], bf16>, %w: !fusion.tensor<[8, 16], bf16>,
                 %wt: !fusion.tensor<[16, 8], bf16>, %bias: !fusion.tensor<[16], bf16>,
                 %y: !fusion.tensor<[?, 16], bf16>, %z: !fusion.tensor<[?, 16], bf16, mesh = [0, 1]>,
                 %f: !fusion.tensor<[?, 16], f32>, %r: !fusion.tensor<[?], bf16>,
                 %k: !fusion.tensor<[?, 1], bf16>) {
  hir.matmul ins(%x, %w : !fusion.tensor<[?, 8], bf16>, !fusion.tensor<[8, 16], bf16>) outs(%y : !fusion.tensor<[?, 16], bf16>)
  hir.matmul accumulate ins(%x, %w : !fusion.tensor<[?, 8], bf16>, !fusion.tensor<[8, 16], bf16>) outs(%y : !fusion.tensor<[?, 16], bf16>) {tag}
  hir.linear ins(%x, %wt : !fusion.tensor<[?, 8], bf16>, !fusion.tensor<[16, 8], bf16>) outs(%y : !fusion.tensor<[?, 16], bf16>)
  hir.linear ins(%x, %wt, %bias : !fusion.tensor<[?, 8], bf16>, !fusion.tensor<[16, 8], bf16>, !fusion.tensor<[16], bf16>) outs(%y : !fusion.tensor<[?, 16], bf16>) {tag}
  hir.copy ins(%y : !fusion.tensor<[?, 16], bf16>) outs(%z : !fusion.tensor<[?, 16], bf16, mesh = [0, 1]>)
  hir.pointwise "relu" ins(%y : !fusion.tensor<[?, 16], bf16>) outs(%y : !fusion.tensor<[?, 16], bf16>)
  hir.pointwise "add" ins(%y, %bias : !fusion.tensor<[?, 16], bf16>, !fusion.tensor<[16], bf16>) outs(%y : !fusion.tensor<[?, 16], bf16>)
  hir.pointwise "cast" ins(%y : !fusion.tensor<[?, 16], bf16>) outs(%f : !fusion.tensor<[?, 16], f32>) {tag}
  hir.reduction "sum" [1] ins(%y : !fusion.tensor<[?, 16], bf16>) outs(%r : !fusion.tensor<[?], bf16>)
  hir.reduction "max" [-1] keepdim ins(%y : !fusion.tensor<[?, 16], bf16>) outs(%k : !fusion.tensor<[?, 1], bf16>) {tag}
  func.return
}

// The marks of forward-buffers: a copy whose out is its source buffer, and the outs that
// become the tensors an ATen op or a data-movement segment makes.
// CHECK-LABEL: func.func @forwarded(
// CHECK:      hir.copy ins(%s : !fusion.tensor<[?, 4], f32, axes = [stream, _]>) outs(%w : !fusion.tensor<[?, 4], f32>) forwards_source
// CHECK:      hir.copy ins(%w : !fusion.tensor<[?, 4], f32>) outs(%c : !fusion.tensor<[?, 4], f32>) forwards_source {tag}
// CHECK:      hir.aten "aten.var_mean.correction"(%a, [1]) ins(%a : !fusion.tensor<[?, 4], f32>) outs(%var, %mean : !fusion.tensor<[?], f32>, !fusion.tensor<[?], f32>) adopted [0, 1]
// CHECK:      hir.aten "aten.t.default"(%a) ins(%a : !fusion.tensor<[?, 4], f32>) outs(%t : !fusion.tensor<[4, ?], f32>) adopted [0] {tag}
// CHECK:      hir.post_on_stream @segment ins(%a, %v : !fusion.tensor<[?, 4], f32>, !fusion.tensor<[4], f32>) outs(%p, %q : !fusion.tensor<[?, 4], f32>, !fusion.tensor<[?, 4], f32>) adopted [1]
// GENERIC-LABEL: sym_name = "forwarded"
// GENERIC: "hir.copy"(%s, %w) <{forwards_source, operandSegmentSizes = array<i32: 1, 1>}>
// GENERIC: "hir.copy"(%w, %c) <{forwards_source, operandSegmentSizes = array<i32: 1, 1>}> {tag}
// GENERIC: "hir.aten"(%a, %var, %mean) <{target = "aten.var_mean.correction", call = "[[{'operand': 0}, [1]], {}]", adopted = array<i64: 0, 1>, operandSegmentSizes = array<i32: 1, 2>}>
// GENERIC: "hir.aten"(%a, %t) <{target = "aten.t.default", call = "[[{'operand': 0}], {}]", adopted = array<i64: 0>, operandSegmentSizes = array<i32: 1, 1>}> {tag}
// GENERIC: "hir.post_on_stream"(%a, %v, %p, %q) <{callee = @segment, adopted = array<i64: 1>, operandSegmentSizes = array<i32: 2, 2>}>
func.func @forwarded(%a: !fusion.tensor<[?, 4], f32>, %v: !fusion.tensor<[4], f32>) {
  %n = hir.dim %a, 0 : !fusion.tensor<[?, 4], f32>
  %s = hir.allocate(%n) : !fusion.tensor<[?, 4], f32, axes = [stream, _]>
  %w = hir.allocate(%n) : !fusion.tensor<[?, 4], f32>
  hir.copy ins(%s : !fusion.tensor<[?, 4], f32, axes = [stream, _]>) outs(%w : !fusion.tensor<[?, 4], f32>) forwards_source
  %c = hir.allocate(%n) : !fusion.tensor<[?, 4], f32>
  hir.copy ins(%w : !fusion.tensor<[?, 4], f32>) outs(%c : !fusion.tensor<[?, 4], f32>) forwards_source {tag}
  %var = hir.allocate(%n) : !fusion.tensor<[?], f32>
  %mean = hir.allocate(%n) : !fusion.tensor<[?], f32>
  hir.aten "aten.var_mean.correction" call "[[{'operand': 0}, [1]], {}]" ins(%a : !fusion.tensor<[?, 4], f32>) outs(%var, %mean : !fusion.tensor<[?], f32>, !fusion.tensor<[?], f32>) adopted [0, 1]
  %t = hir.allocate(%n) : !fusion.tensor<[4, ?], f32>
  hir.aten "aten.t.default" call "[[{'operand': 0}], {}]" ins(%a : !fusion.tensor<[?, 4], f32>) outs(%t : !fusion.tensor<[4, ?], f32>) adopted [0] {tag}
  %p = hir.allocate(%n) : !fusion.tensor<[?, 4], f32>
  %q = hir.allocate(%n) : !fusion.tensor<[?, 4], f32>
  hir.post_on_stream @segment ins(%a, %v : !fusion.tensor<[?, 4], f32>, !fusion.tensor<[4], f32>) outs(%p, %q : !fusion.tensor<[?, 4], f32>, !fusion.tensor<[?, 4], f32>) adopted [1]
  func.return
}

// ====================================================================================
// Attention on buffers
// ====================================================================================

// hir.attention and hir.attention_backward: the fusion ops' properties, one block of keys
// (`block`, the ring's step, under a causal layout), outs of their own element type (f32
// where a ring keeps running sums), a mask operand last among the ins, and without a block
// the outs adopted as the kernel's results.
// CHECK-LABEL: func.func @attention(
// CHECK: hir.attention causal head_tail block %s ins(%q, %k, %k : !fusion.tensor<[2, 2, 4, 8, 16], bf16, mesh = [0, 1], axes = [didx, _, _, _, _]>, !fusion.tensor<[2, 4, 8, 16], bf16, mesh = [0, 1]>, !fusion.tensor<[2, 4, 8, 16], bf16, mesh = [0, 1]>) outs(%out, %lse : !fusion.tensor<[2, 2, 4, 8, 16], f32, mesh = [0, 1], axes = [didx, _, _, _, _]>, !fusion.tensor<[2, 2, 4, 8], f32, mesh = [0, 1], axes = [didx, _, _, _]>)
// CHECK-NEXT: hir.attention causal contiguous blocks scale 5.000000e-01 ins(%q, %blocks, %blocks : {{.*}}) outs(%out, %lse : {{.*}}) {tag}
// CHECK: hir.attention_backward causal head_tail block %s ins(%q, %q, %k, %k, %q, %lse : {{.*}}) outs(%bq, %bk, %bv : {{.*}})
// CHECK: hir.attention ins(%q, %kk, %kk, %m : {{.*}}, !fusion.tensor<[2, 1, 1, 8, 16], i1, mesh = [0, 1], axes = [didx, _, _, _, _]>) outs(%mo, %lse : {{.*}}) adopted [0]{{$}}
// GENERIC-LABEL: sym_name = "attention"
// GENERIC: "hir.attention"(%s, %q, %k, %k, %out, %lse) <{causal = #fusion<causal head_tail>, operandSegmentSizes = array<i32: 1, 3, 2>}>
// GENERIC-NEXT: "hir.attention"(%q, %blocks, %blocks, %out, %lse) <{causal = #fusion<causal contiguous>, blocks, scale = 5.000000e-01 : f64, operandSegmentSizes = array<i32: 0, 3, 2>}> {tag}
// GENERIC: "hir.attention_backward"(%s, %q, %q, %k, %k, %q, %lse, %bq, %bk, %bv) <{causal = #fusion<causal head_tail>, operandSegmentSizes = array<i32: 1, 6, 3>}>
// GENERIC: "hir.attention"(%q, %kk, %kk, %m, %mo, %lse) <{adopted = array<i64: 0>, operandSegmentSizes = array<i32: 0, 4, 2>}>
func.func @attention(%q: !fusion.tensor<[2, 2, 4, 8, 16], bf16, mesh = [0, 1], axes = [didx, _, _, _, _]>,
                     %k: !fusion.tensor<[2, 4, 8, 16], bf16, mesh = [0, 1]>,
                     %blocks: !fusion.tensor<[2, 2, 4, 8, 16], bf16, mesh = [0, 1]>,
                     %m: !fusion.tensor<[2, 1, 1, 8, 16], i1, mesh = [0, 1], axes = [didx, _, _, _, _]>, %s: index) {
  %out = hir.allocate() : !fusion.tensor<[2, 2, 4, 8, 16], f32, mesh = [0, 1], axes = [didx, _, _, _, _]>
  %lse = hir.allocate() : !fusion.tensor<[2, 2, 4, 8], f32, mesh = [0, 1], axes = [didx, _, _, _]>
  hir.attention causal head_tail block %s ins(%q, %k, %k : !fusion.tensor<[2, 2, 4, 8, 16], bf16, mesh = [0, 1], axes = [didx, _, _, _, _]>, !fusion.tensor<[2, 4, 8, 16], bf16, mesh = [0, 1]>, !fusion.tensor<[2, 4, 8, 16], bf16, mesh = [0, 1]>) outs(%out, %lse : !fusion.tensor<[2, 2, 4, 8, 16], f32, mesh = [0, 1], axes = [didx, _, _, _, _]>, !fusion.tensor<[2, 2, 4, 8], f32, mesh = [0, 1], axes = [didx, _, _, _]>)
  hir.attention causal contiguous blocks scale 0.5 ins(%q, %blocks, %blocks : !fusion.tensor<[2, 2, 4, 8, 16], bf16, mesh = [0, 1], axes = [didx, _, _, _, _]>, !fusion.tensor<[2, 2, 4, 8, 16], bf16, mesh = [0, 1]>, !fusion.tensor<[2, 2, 4, 8, 16], bf16, mesh = [0, 1]>) outs(%out, %lse : !fusion.tensor<[2, 2, 4, 8, 16], f32, mesh = [0, 1], axes = [didx, _, _, _, _]>, !fusion.tensor<[2, 2, 4, 8], f32, mesh = [0, 1], axes = [didx, _, _, _]>) {tag}
  %bq = hir.allocate() : !fusion.tensor<[2, 2, 4, 8, 16], bf16, mesh = [0, 1], axes = [didx, _, _, _, _]>
  %bk = hir.allocate() : !fusion.tensor<[2, 2, 4, 8, 16], bf16, mesh = [0, 1], axes = [didx, _, _, _, _]>
  %bv = hir.allocate() : !fusion.tensor<[2, 2, 4, 8, 16], f32, mesh = [0, 1], axes = [didx, _, _, _, _]>
  hir.attention_backward causal head_tail block %s ins(%q, %q, %k, %k, %q, %lse : !fusion.tensor<[2, 2, 4, 8, 16], bf16, mesh = [0, 1], axes = [didx, _, _, _, _]>, !fusion.tensor<[2, 2, 4, 8, 16], bf16, mesh = [0, 1], axes = [didx, _, _, _, _]>, !fusion.tensor<[2, 4, 8, 16], bf16, mesh = [0, 1]>, !fusion.tensor<[2, 4, 8, 16], bf16, mesh = [0, 1]>, !fusion.tensor<[2, 2, 4, 8, 16], bf16, mesh = [0, 1], axes = [didx, _, _, _, _]>, !fusion.tensor<[2, 2, 4, 8], f32, mesh = [0, 1], axes = [didx, _, _, _]>) outs(%bq, %bk, %bv : !fusion.tensor<[2, 2, 4, 8, 16], bf16, mesh = [0, 1], axes = [didx, _, _, _, _]>, !fusion.tensor<[2, 2, 4, 8, 16], bf16, mesh = [0, 1], axes = [didx, _, _, _, _]>, !fusion.tensor<[2, 2, 4, 8, 16], f32, mesh = [0, 1], axes = [didx, _, _, _, _]>)
  %mo = hir.allocate() : !fusion.tensor<[2, 2, 4, 8, 16], bf16, mesh = [0, 1], axes = [didx, _, _, _, _]>
  %kk = hir.allocate() : !fusion.tensor<[2, 4, 16, 16], bf16, mesh = [0, 1]>
  hir.attention ins(%q, %kk, %kk, %m : !fusion.tensor<[2, 2, 4, 8, 16], bf16, mesh = [0, 1], axes = [didx, _, _, _, _]>, !fusion.tensor<[2, 4, 16, 16], bf16, mesh = [0, 1]>, !fusion.tensor<[2, 4, 16, 16], bf16, mesh = [0, 1]>, !fusion.tensor<[2, 1, 1, 8, 16], i1, mesh = [0, 1], axes = [didx, _, _, _, _]>) outs(%mo, %lse : !fusion.tensor<[2, 2, 4, 8, 16], bf16, mesh = [0, 1], axes = [didx, _, _, _, _]>, !fusion.tensor<[2, 2, 4, 8], f32, mesh = [0, 1], axes = [didx, _, _, _]>) adopted [0]
  func.return
}

// A rendezvous port for a gang (the launch contract's MASTER_PORT): the
// daemon picks one for every attempt; tests and benchmarks that start
// gangs by hand use the same function.
#ifndef TRAINSUP_CONTRACTS_FREE_PORT_H_
#define TRAINSUP_CONTRACTS_FREE_PORT_H_

namespace trainsup {

// A TCP port on the loopback interface that nobody listened on when it was
// asked (the kernel's choice for port 0). Another process may take it
// before the caller does: rank 0 then fails to host the store, exits 76
// and the gang's next attempt gets another port. `fallback` when no socket
// could be made.
int FreeLoopbackPort(int fallback = 29500);

}  // namespace trainsup

#endif  // TRAINSUP_CONTRACTS_FREE_PORT_H_

/* TEST STAND-IN for RCCL's public header (rigbook lab tests): only what the rccl-tests stand-in calls. */
#ifndef RCCL_STANDIN_H
#define RCCL_STANDIN_H
#ifdef __cplusplus
extern "C" {
#endif
typedef int ncclResult_t;
typedef struct ncclComm* ncclComm_t;
ncclResult_t ncclGetVersion(int* version);
ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
/* Stand-in only: 1 when the communicator's channels go through P2P, 0 through SHM. */
int rcclStandinP2p(ncclComm_t comm);
/* Stand-in only: the GPU targets the library was configured for. */
const char* rcclStandinGpuTargets(void);
#ifdef __cplusplus
}
#endif
#endif

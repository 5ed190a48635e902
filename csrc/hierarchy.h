/* hierarchy.h — running one collective as local phase, leaders' phase, local phase. */
#ifndef RUCCL_HIERARCHY_H
#define RUCCL_HIERARCHY_H

#include "algorithms/algo_internal.h"
#include "algorithms/algorithms.h"
#include "collective.h"

typedef struct {
  ruccl_comm_t *comm;
  const ruccl_algorithm_table_t *local, *global;
  unsigned local_arity, global_arity;
  const ruccl_team_t *local_team; /* this node's peers */
  const ruccl_team_t *net_team;   /* the node leaders; NULL unless this peer leads its node */
} ruccl_hier_t;

/* a->root is a global peer index; a->divisor the number of peers of all nodes. */
ruccl_result_t ruccl_hier_run(const ruccl_hier_t *h, int kind, const ruccl_args_t *a);

#endif

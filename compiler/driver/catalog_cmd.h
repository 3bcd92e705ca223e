/* catalog_cmd.h - `hpdlc catalog`: the hardware catalog on the command line.
 *
 * Lists the devices and clusters `hpdlc plan` knows (compiler/front/catalog.c,
 * docs/catalog.md) with the figures it prices them by, or one entry in full -
 * a device's datasheet figures beside the planner's own (SMs, GEMM ceiling,
 * family), a cluster's links and the cluster block that writes it - as text
 * or JSON. */
#ifndef HPDL_CATALOG_CMD_H
#define HPDL_CATALOG_CMD_H

/* argv[0] is "catalog"; returns the exit status (0, 1 an unknown name, 2 a bad command line). */
int catalog_main(int argc, char **argv);

#endif

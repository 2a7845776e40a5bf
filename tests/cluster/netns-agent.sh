#!/bin/sh
# Open MPI's launch agent for hosts emulated by network namespaces, used in place of ssh
# (mpirun --mca plm_rsh_agent tests/cluster/netns-agent.sh): called as `netns-agent.sh HOST COMMAND...`, it
# runs COMMAND, as ssh would (one shell command line), in HOST's namespace under HOST's own host name.
# STRATA_AGENT_HOSTS maps hosts: "ADDRESS=NAMESPACE:HOSTNAME ..." (e.g. "10.200.0.2=strata-1-b:strata-b").
host=$1
shift
for entry in $STRATA_AGENT_HOSTS; do
  address=${entry%%=*}
  target=${entry#*=}
  if [ "$host" = "$address" ] || [ "$host" = "${target#*:}" ]; then
    exec nsenter --net="/run/netns/${target%%:*}" unshare --uts /bin/sh -c "hostname ${target#*:} && $*"
  fi
done
echo "netns-agent: unknown host $host (STRATA_AGENT_HOSTS: $STRATA_AGENT_HOSTS)" >&2
exit 255

package rollout

// CarryBefore is carryBefore, for the scripts' start, which builds its
// start by hand and carries as apply's NewStart does.
var CarryBefore = carryBefore

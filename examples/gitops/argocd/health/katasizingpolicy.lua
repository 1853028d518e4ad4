-- Argo CD health of a KataSizingPolicy, from the conditions the kata-sizing operator writes.
-- Ready True: Healthy. Ready False: Degraded with the reason and message, except
-- RuntimeClassMissing (managedBy: KataDeploy, the chart has yet to create the classes from the
-- overlay): Progressing. No status yet, an older generation, or Ready Unknown: Progressing.
-- Uses only what Argo CD opens for health scripts (base and table; no string library).
local hs = {status = "Progressing", message = "waiting for the kata-sizing operator"}
if obj.status == nil or obj.status.conditions == nil then
  return hs
end
local generation = obj.metadata.generation
if generation ~= nil and obj.status.observedGeneration ~= generation then
  hs.message = "waiting for the kata-sizing operator to reconcile generation " .. tostring(generation)
  return hs
end
for _, condition in ipairs(obj.status.conditions) do
  if condition.type == "Ready" then
    local text = condition.reason or ""
    if condition.message ~= nil and condition.message ~= "" then
      text = text .. ": " .. condition.message
    end
    if condition.status == "True" then
      hs.status = "Healthy"
    elseif condition.status == "False" and condition.reason ~= "RuntimeClassMissing" then
      hs.status = "Degraded"
    end
    hs.message = text
    return hs
  end
end
return hs

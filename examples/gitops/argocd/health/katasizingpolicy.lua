-- Argo CD health of a KataSizingPolicy, from the conditions the kata-sizing operator writes.
-- Ready True: Healthy. Ready False: Degraded with the reason and message (for an invalid policy
-- the Valid condition's message, which names every rule it breaks), except RuntimeClassMissing
-- (managedBy: KataDeploy, the chart has yet to create the classes from the overlay): Progressing.
-- No status yet, an older generation, or Ready Unknown: Progressing.
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
local ready = nil
local valid = nil
for _, condition in ipairs(obj.status.conditions) do
  if condition.type == "Ready" then
    ready = condition
  elseif condition.type == "Valid" then
    valid = condition
  end
end
if ready == nil then
  return hs
end
local message = ready.message
if ready.status == "False" and valid ~= nil and valid.status == "False" and valid.message ~= nil and valid.message ~= "" then
  message = valid.message
end
local text = ready.reason or ""
if message ~= nil and message ~= "" then
  text = text .. ": " .. message
end
if ready.status == "True" then
  hs.status = "Healthy"
elseif ready.status == "False" and ready.reason ~= "RuntimeClassMissing" then
  hs.status = "Degraded"
end
hs.message = text
return hs

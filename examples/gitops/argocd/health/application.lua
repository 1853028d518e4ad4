-- Argo CD health of an Application, for app-of-apps: without it a parent Application treats its
-- children as healthy the moment they exist, and sync waves between them order nothing.
local hs = {status = "Progressing", message = ""}
if obj.status ~= nil and obj.status.health ~= nil and obj.status.health.status ~= nil then
  hs.status = obj.status.health.status
  if obj.status.health.message ~= nil then
    hs.message = obj.status.health.message
  end
end
return hs
